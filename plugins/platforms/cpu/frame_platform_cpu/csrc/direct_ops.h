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

// The threads of one parallel region that runs a stretch of a step program's direct calls (step_program.cpp):
// this thread's number and how many there are.
struct Team {
  int thread;
  int threads;
};

// An op's share of the work for one thread of a team, which every thread of the team calls with the same
// arguments; the program puts a barrier after it. It must not make or drop a tensor handle (a reference count
// shared by the threads) or call at::parallel_for, and it takes its inputs contiguous.
using TeamOp = void (*)(const c10::IValue* const* args, const Team& team);

// "frame_cpu::<name>" -> its team form; filled by RegisterTeam at load. A direct op without one runs on the team's
// first thread while the others wait.
std::unordered_map<std::string, TeamOp>& team_ops();

struct RegisterTeam {
  RegisterTeam(const char* name, TeamOp op) { team_ops().emplace(name, op); }
};

// [begin, end) of `n` items for this thread: contiguous, as even as they divide.
inline std::pair<int64_t, int64_t> share(int64_t n, const Team& team) {
  return {n * team.thread / team.threads, n * (team.thread + 1) / team.threads};
}

}  // namespace frame_cpu
