// Ops of this library that a step program (step_program.cpp) calls without the dispatcher.
//
// A replayed decode step calls each of its ops a few hundred times a second; through the dispatcher each call
// builds an argument stack (a reference count taken and dropped on every tensor) and looks its kernel up, and once
// a step's weights have streamed through the caches every tensor it touches there is a miss. A direct op takes its
// arguments as they lie in the program, in schema order, and calls the kernel function itself.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace frame_cpu {

using DirectOp = void (*)(const c10::IValue* const* args);

// "frame_cpu::<name>" -> its direct form; filled by RegisterDirect at load.
std::unordered_map<std::string, DirectOp>& direct_ops();

struct RegisterDirect {
  RegisterDirect(const char* name, DirectOp op) { direct_ops().emplace(name, op); }
};

// A tensor argument the op writes into (a `Tensor(a!)`): the program's handle, whose data the op changes.
inline at::Tensor& written(const c10::IValue* value) { return const_cast<at::Tensor&>(value->toTensor()); }

// The barrier and scratch of the team running a stretch (step_program.cpp).
struct TeamShared;

// The threads of one parallel region that runs a stretch of a step program's direct calls (step_program.cpp):
// this thread's number and how many there are. {0, 1}: a team of one (a call run whole on one thread).
struct Team {
  int thread;
  int threads;
  TeamShared* shared = nullptr;
};

// Waits for the team's other threads (returns at once in a team of one). A bound call that uses it must call it
// as many times on every thread, and raise on every thread or on none before it.
void team_sync(const Team& team);

// At least `bytes` of scratch that the team's threads share for the current call (64-byte aligned): every thread
// asks for the same size, and it syncs. A team of one gets its thread's own buffer.
void* team_scratch(const Team& team, size_t bytes);

// A direct call whose operands were checked and resolved to pointers and sizes in one small record: what a team's
// threads run, each its share. A call whose arguments are all the program's constants is bound once, when the
// program plans its teams; a team's call then reads its record, one line or two in a row of them, where the direct
// form walks each tensor argument (the IValue, the TensorImpl, its storage), every step a chain of cache misses once
// the weights have streamed through. A call that reads a tensor the run makes is bound by each thread as the call
// comes. A record holds no tensor handle (a reference count the threads would share): it stays valid while the
// program holds its constants and their storage stays where it is (weights, the KV pool, the planned buffers).
struct BoundCall {
  static constexpr size_t kStateBytes = 176;

  // Runs this thread's share (`shared`), or the whole call when the team is {0, 1}.
  void (*run)(const BoundCall& call, const Team& team) = nullptr;
  bool shared = false;  // every thread of a team takes a share; otherwise the first thread runs it whole
  alignas(8) unsigned char state[kStateBytes];

  template <class T>
  T& as() {
    static_assert(sizeof(T) <= kStateBytes && std::is_trivially_copyable_v<T>, "a bound call's record is plain data");
    return *reinterpret_cast<T*>(state);
  }
  template <class T>
  const T& as() const {
    return const_cast<BoundCall*>(this)->as<T>();
  }
};

// Checks the arguments (in schema order) and fills `call`; false where these operands cannot be shared (x not
// contiguous: the direct form makes a copy), and a team's first thread runs the direct form while the others wait;
// an error where the direct form would raise one. It must not make or drop a tensor handle or call
// at::parallel_for: every thread of a team may call it with the same arguments.
using BindOp = bool (*)(const c10::IValue* const* args, BoundCall& call);

// How a bound op counts when the program looks for stretches to run as teams. A team's region and barriers pay
// for themselves where a stretch holds at least two calls that split big work (kAnchors: the linears, the argmax
// over the vocabulary); light calls (kJoins: a norm, an activation) take their share inside a stretch but do not
// make one.
enum class Stretch { kJoins, kAnchors };

struct BindForm {
  BindOp bind;
  Stretch stretch;
};

// "frame_cpu::<name>" -> its binder; filled by RegisterBind at load.
std::unordered_map<std::string, BindForm>& bind_ops();

struct RegisterBind {
  RegisterBind(const char* name, BindOp op, Stretch stretch) { bind_ops().emplace(name, BindForm{op, stretch}); }
};

// [begin, end) of `n` items for this thread: contiguous, as even as they divide.
inline std::pair<int64_t, int64_t> share(int64_t n, const Team& team) {
  return {n * team.thread / team.threads, n * (team.thread + 1) / team.threads};
}

// Binds `work` (plain data with units() and run(begin, end) over them) so that each thread of a team runs its
// contiguous share of the units: most ops' bound form.
template <class Work>
void bind_shares(BoundCall& call, const Work& work) {
  call.as<Work>() = work;
  call.shared = true;
  call.run = [](const BoundCall& bound, const Team& team) {
    const Work& w = bound.as<Work>();
    const auto [begin, end] = share(w.units(), team);
    w.run(begin, end);
  };
}

}  // namespace frame_cpu
