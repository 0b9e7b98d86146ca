// A native op's team form: the op's work shared by the threads of a parallel region that is already running.
//
// The cpu platform runs a recorded decode step as a native program, and a layer's calls in one OpenMP parallel
// region whose threads meet at a spin barrier after each call (plugins/platforms/cpu, csrc/step_program.cpp). An op
// of another plugin's library, an attention backend's, joins that region through its team form: a function every
// thread of the team calls at once with the same arguments, each doing its share, which together do what one call
// of the op does. An op without one makes the program leave the region for it (the op then opens its own): two
// region starts a layer, each a few microseconds with the threads on two CCDs.
//
// An op `ns::name` offers its team form by also defining the op `ns::name_team_form() -> int`, whose value is the
// form's address (FRAME_TEAM_FORM below). The caller finds it through torch's dispatcher, so neither library links
// the other; the op's value carries this header's version too, so a library built against another version of the
// contract is passed over (called through the dispatcher, outside the region) rather than misread.
//
// A plugin's native build sees this header through frame.native.load_library (`#include <frame/team_form.h>`).
#pragma once

#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace frame {

// The version of this contract; a caller uses a form only where the op's `_team_form` reports the same.
constexpr int64_t kTeamFormVersion = 1;

// The team calling a form: this thread's number, how many threads there are, and how they meet.
struct Team {
  int thread;   // 0 .. threads - 1; thread 0 is the one that called the program
  int threads;
  void* context;                                        // the caller's, for the two functions below
  void (*sync_fn)(const Team& team);                    // see sync()
  void* (*scratch_fn)(const Team& team, size_t bytes);  // see scratch()

  // Waits until every thread of the team has called it as many times (a spin barrier: a cache line's round trip).
  void sync() const { sync_fn(*this); }

  // At least `bytes` of zero-filled memory the team's threads share for this call, 64-byte aligned. Every thread
  // asks once per call, with the same size, before it shares anything else; it syncs.
  void* scratch(size_t bytes) const { return scratch_fn(*this, bytes); }
};

// A team form: `args` are the op's arguments in schema order (the op's declared defaults filled in). Every thread
// of `team` calls it with the same arguments; it returns when this thread's share is done, and the caller meets
// the team after it, so a form needs no final sync. Rules, for the form to be safe in any team:
// - it raises on every thread or on none before each sync (check the arguments first, on every thread);
// - it shares work through the team only: an at::parallel_for inside the region runs on its calling thread alone;
// - a team of one ({0, 1}) must work: the caller may run the form alone.
using TeamForm = void (*)(const c10::IValue* const* args, const Team& team);

}  // namespace frame

// Defines, inside a TORCH_LIBRARY(ns, m) block, the op `<name>_team_form`, whose value packs the address of `form`
// with kTeamFormVersion: `FRAME_TEAM_FORM(m, "forward", forward_team);`.
#define FRAME_TEAM_FORM(library, name, form)                                                                  \
  (library).def(name "_team_form() -> int[]", []() -> std::vector<int64_t> {                                  \
    return {frame::kTeamFormVersion, static_cast<int64_t>(reinterpret_cast<intptr_t>(                         \
                                         static_cast<frame::TeamForm>(form)))};                               \
  })
