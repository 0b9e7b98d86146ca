// Ops of this library that a step program (step_program.cpp) calls without the dispatcher.
//
// A replayed decode step calls each of its ops a few hundred times a second; through the dispatcher each call
// builds an argument stack (a reference count taken and dropped on every tensor) and looks its kernel up, and once
// a step's weights have streamed through the caches every tensor it touches there is a miss. A direct op takes its
// arguments as they lie in the program, in schema order, and calls the kernel function itself.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>
#include <unordered_map>

namespace frame_cpu {

using DirectOp = void (*)(const c10::IValue* const* args);

// "frame_cpu::<name>" -> its direct form; filled by RegisterDirect at load.
std::unordered_map<std::string, DirectOp>& direct_ops();

struct RegisterDirect {
  RegisterDirect(const char* name, DirectOp op) { direct_ops().emplace(name, op); }
};

// A tensor argument the op writes into (a `Tensor(a!)`): the program's handle, whose data the op changes.
inline at::Tensor& written(const c10::IValue* value) { return const_cast<at::Tensor&>(value->toTensor()); }

}  // namespace frame_cpu
