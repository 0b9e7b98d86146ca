// A recorded decode step as a native program: its op calls in order, run by one C++ loop.
//
// program.py builds it from a recording (record.py), planned (plan.py). Each call reads its arguments from
// constants (the step's external tensors: weights, KV pool, the runner's input buffers and the planned buffers,
// held here, so their data is read as it is at each run) or from slots (tensors an earlier call of the same run
// made). An op of this library with a direct form (direct_ops.h) is called as a function; any other op (aten's, an
// attention backend's) through the dispatcher with a boxed stack, as TorchScript's interpreter would, without the
// interpreter's per-instruction work.
//
// A stretch of direct calls and team forms with at least two anchors among them (products a team splits:
// direct_ops.h's Stretch) runs in one parallel region: every thread walks the stretch, a call with a binder gives
// each thread its share, any other direct call runs on the first thread, and the threads meet at a spin barrier
// after each. Each linear opening and closing its own OpenMP region cost 3-4 us a call with the threads on two Zen 4
// CCDs (the worker starting 1.2 us late, a futex wake at each libgomp barrier); a spin barrier costs the cache
// line's round trip. An op of another library joins a stretch through its team form (<frame/team_form.h>): the
// attention backend's, so that a decode step whose attention has one is a single region from its first layer's
// QKV projection to the logits, rather than two regions a layer (the layer's linears, then the attention's own).

#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include "direct_ops.h"

#include <frame/team_form.h>

#include <ATen/Parallel.h>
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace frame_cpu {

std::unordered_map<std::string, DirectOp>& direct_ops() {
  static std::unordered_map<std::string, DirectOp> ops;
  return ops;
}

std::unordered_map<std::string, BindForm>& bind_ops() {
  static std::unordered_map<std::string, BindForm> ops;
  return ops;
}

constexpr size_t kMaxDirectArgs = 16;
// Pauses before a waiting thread starts yielding its core (a few hundred microseconds): past that the other thread
// is likely descheduled, and spinning would keep it off the core it needs.
constexpr int kSpinsBeforeYield = 1 << 13;

// Threads meet here: the last to arrive moves the generation on, the others spin until it moves.
struct SpinBarrier {
  alignas(64) std::atomic<int> arrived{0};
  alignas(64) std::atomic<int> generation{0};

  // Not inlined, so that a profile tells the time threads wait here from the kernels' (kernel_share.py).
  __attribute__((noinline)) void wait(int threads) {
    const int seen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == threads - 1) {
      arrived.store(0, std::memory_order_relaxed);
      generation.store(seen + 1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation.load(std::memory_order_acquire) == seen; ++spins) {
#if defined(__x86_64__)
      if (spins < kSpinsBeforeYield) {
        _mm_pause();
        continue;
      }
#endif
      std::this_thread::yield();
    }
  }
};

struct TeamShared {
  SpinBarrier barrier;
  std::vector<uint8_t>* scratch;
};

namespace {

uint8_t* aligned(std::vector<uint8_t>& buffer) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(buffer.data()) + 63) & ~uintptr_t{63});
}

// A team form's frame::Team (<frame/team_form.h>) over a stretch's team.
void form_sync(const frame::Team& team) {
  if (team.threads > 1) static_cast<TeamShared*>(team.context)->barrier.wait(team.threads);
}

void* form_scratch(const frame::Team& team, size_t bytes) {
  auto& buffer = *static_cast<TeamShared*>(team.context)->scratch;
  // The team met after the previous call, so nobody reads the buffer while the first thread zeroes it.
  if (team.thread == 0) {
    if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
    std::memset(aligned(buffer), 0, bytes);
  }
  form_sync(team);
  return aligned(buffer);
}

}  // namespace

void team_sync(const Team& team) {
  if (team.shared != nullptr && team.threads > 1) team.shared->barrier.wait(team.threads);
}

void* team_scratch(const Team& team, size_t bytes) {
  bytes += 64;
  std::vector<uint8_t>* buffer = nullptr;
  if (team.shared == nullptr) {
    thread_local std::vector<uint8_t> own;
    buffer = &own;
    if (buffer->size() < bytes) buffer->resize(bytes);
  } else {
    buffer = team.shared->scratch;
    if (team.thread == 0 && buffer->size() < bytes) buffer->resize(bytes);
    team_sync(team);
  }
  return aligned(*buffer);
}

namespace {

enum class ListKind { kNone, kTensors, kOptionalTensors };

struct Instruction {
  std::optional<c10::OperatorHandle> op;  // empty: a copy of one value into a slot (a rename, `detach`)
  DirectOp direct = nullptr;
  frame::TeamForm team_form = nullptr;    // another library's op that a team runs together (<frame/team_form.h>)
  BindOp bind = nullptr;                  // the direct op's binder (direct_ops.h): its share for a team's thread
  bool anchors = false;                   // its binder's Stretch::kAnchors: two of them make a team stretch
  std::vector<c10::IValue> constants;     // per argument: its value, or None where it reads a slot
  std::vector<int64_t> reads;             // per argument: the slot it reads, or -1 for its constant
  std::vector<int64_t> writes;            // per returned value: the slot it fills, or -1 when dropped
  bool unpacks = false;                   // the op returns one list (aten::chunk): writes are its elements'
  ListKind list = ListKind::kNone;        // no op: a list of tensors built from the arguments (make_list)
};

class StepProgram : public torch::CustomClassHolder {
 public:
  explicit StepProgram(int64_t num_slots) : slots_(num_slots) {}

  // Append a call of op `name` (aten::mul, frame_cpu::packed_linear_into) with overload `overload` ("" for the
  // default). `constants`, `reads` and `writes` as Instruction's.
  void call(const std::string& name, const std::string& overload, std::vector<c10::IValue> constants,
            std::vector<int64_t> reads, std::vector<int64_t> writes) {
    TORCH_CHECK(constants.size() == reads.size(), "one slot or -1 per argument");
    check_slots(reads);
    check_slots(writes);
    Instruction instruction;
    instruction.op = c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
    TORCH_CHECK(instruction.op->schema().arguments().size() == constants.size(), name, " takes ",
                instruction.op->schema().arguments().size(), " arguments, the program gives it ", constants.size());
    const auto& arguments = instruction.op->schema().arguments();
    for (size_t i = 0; i < constants.size(); ++i) constants[i] = as_argument(std::move(constants[i]), arguments[i]);
    const auto found = direct_ops().find(name);
    if (found != direct_ops().end() && (overload.empty() || overload == "default") && writes.empty() &&
        constants.size() <= kMaxDirectArgs) {
      instruction.direct = found->second;
      const auto bind = bind_ops().find(name);
      if (bind != bind_ops().end()) {
        instruction.bind = bind->second.bind;
        instruction.anchors = bind->second.stretch == Stretch::kAnchors;
      }
    }
    if (instruction.direct == nullptr && writes.empty() && constants.size() <= kMaxDirectArgs &&
        (overload.empty() || overload == "default"))
      instruction.team_form = find_team_form(name);
    const auto& returns = instruction.op->schema().returns();
    instruction.unpacks = returns.size() == 1 && returns[0].type()->kind() == c10::TypeKind::ListType;
    instruction.constants = std::move(constants);
    instruction.reads = std::move(reads);
    instruction.writes = std::move(writes);
    code_.push_back(std::move(instruction));
  }

  // Append `slot[to] = slot[from]` (from -1: `value`).
  void copy(c10::IValue value, int64_t from, int64_t to) {
    check_slots({from, to});
    Instruction instruction;
    instruction.constants.push_back(std::move(value));
    instruction.reads.push_back(from);
    instruction.writes.push_back(to);
    code_.push_back(std::move(instruction));
  }

  // Append `slot[to] = [values...]`, a list of tensors (a Tensor?[] where `optional`), each from its constant
  // or the slot in `reads`: an argument list holding a tensor the run makes (torch.cat's).
  void make_list(std::vector<c10::IValue> constants, std::vector<int64_t> reads, int64_t to, bool optional) {
    TORCH_CHECK(constants.size() == reads.size(), "one slot or -1 per element");
    check_slots(reads);
    check_slots({to});
    Instruction instruction;
    instruction.constants = std::move(constants);
    instruction.reads = std::move(reads);
    instruction.writes.push_back(to);
    instruction.list = optional ? ListKind::kOptionalTensors : ListKind::kTensors;
    code_.push_back(std::move(instruction));
  }

  // How many calls a team runs through their team forms.
  int64_t num_team_forms() const {
    int64_t n = 0;
    for (const auto& instruction : code_) n += instruction.team_form != nullptr;
    return n;
  }

  // Whether calls with a team form join the team stretches (true at first); off, the program leaves the region
  // for them and calls them through the dispatcher (the op then opens its own).
  void set_team_forms(bool on) {
    team_forms_ = on;
    team_ends_.clear();  // planned again
  }

  // What run() returns: slot `slot`, or `value` where slot is -1 (a planned output buffer).
  void set_output(c10::IValue value, int64_t slot) {
    check_slots({slot});
    output_ = std::move(value);
    output_slot_ = slot;
  }

  int64_t num_direct() const {
    int64_t n = 0;
    for (const auto& instruction : code_) n += instruction.direct != nullptr;
    return n;
  }

  int64_t num_calls() const { return static_cast<int64_t>(code_.size()); }

  // Whether stretches of direct calls run as teams (true at first); off, every call opens its own regions.
  void set_teams(bool on) { teams_ = on; }

  // Whether team stretches run their calls from records bound once (true at first); off, each call reads its
  // arguments' tensors every run.
  void set_bound(bool on) { bound_on_ = on; }

  // How many calls of the team stretches run from bound records (0 with teams or binding off).
  int64_t num_bound() {
    if (!teams_ || !bound_on_) return 0;
    plan_teams();
    int64_t n = 0;
    for (const char b : is_bound_) n += b;
    return n;
  }

  // How many times a run's teams meet at their barrier (0 with teams off).
  int64_t num_barriers() {
    if (!teams_) return 0;
    plan_teams();
    int64_t n = 0;
    for (size_t i = 0; i < code_.size(); ++i)
      for (size_t j = i; team_ends_[i] != 0 && j + 1 < team_ends_[i]; ++j) n += needs_barrier(j);
    return n;
  }

  // One line per call: its op, and within a team stretch whether it is bound, whether the first thread runs it
  // alone, and whether the team meets after it (benchmarks and tests read where a step's barriers fall).
  std::vector<std::string> describe() {
    plan_teams();
    std::vector<std::string> lines;
    size_t end = 0;
    for (size_t i = 0; i < code_.size(); ++i) {
      if (teams_ && team_ends_[i] != 0) end = team_ends_[i];
      std::string line = code_[i].op ? code_[i].op->schema().name() : std::string("(copy)");
      if (i < end)
        line += std::string(" team") + (is_bound_[i] ? " bound" : "") + (joins(code_[i]) ? " form" : "") +
                (alone(i) ? " alone" : " shared") +
                (i + 1 < end && needs_barrier(i) ? " barrier" : "");
      lines.push_back(line);
    }
    return lines;
  }

  // How many stretches run as teams (0 with teams off).
  int64_t num_teams() {
    if (!teams_) return 0;
    plan_teams();
    int64_t n = 0;
    for (const size_t end : team_ends_) n += end != 0;
    return n;
  }

  at::Tensor run() {
    c10::InferenceMode inference;
    plan_teams();
    const int threads = at::get_num_threads();
    const bool teams = teams_ && threads > 1 && !at::in_parallel_region();
    for (size_t i = 0; i < code_.size();) {
      if (teams && team_ends_[i] != 0) {
        run_team(i, team_ends_[i], threads);
        i = team_ends_[i];
      } else {
        execute(code_[i++]);
      }
    }
    at::Tensor out = output_slot_ >= 0 ? slots_[output_slot_].toTensor() : output_.toTensor();
    // The run's own tensors go, as an interpreter's frame would drop them; the next run makes them again.
    for (auto& slot : slots_) slot = c10::IValue();
    return out;
  }

 private:
  void execute(const Instruction& instruction) {
    const size_t n = instruction.constants.size();
    if (instruction.direct != nullptr) {
      const c10::IValue* args[kMaxDirectArgs];
      for (size_t i = 0; i < n; ++i) args[i] = value(instruction, i);
      instruction.direct(args);
    } else if (instruction.op.has_value()) {
      stack_.clear();
      for (size_t i = 0; i < n; ++i) stack_.push_back(*value(instruction, i));
      instruction.op->callBoxed(stack_);
      if (instruction.unpacks && !instruction.writes.empty()) {
        const auto list = stack_.at(0).toList();
        TORCH_CHECK(list.size() >= instruction.writes.size(), "an op returned fewer tensors than recorded");
        for (size_t i = 0; i < instruction.writes.size(); ++i)
          if (instruction.writes[i] >= 0) slots_[instruction.writes[i]] = list.get(i);
      } else {
        TORCH_CHECK(stack_.size() >= instruction.writes.size(), "an op returned fewer values than recorded");
        for (size_t i = 0; i < instruction.writes.size(); ++i)
          if (instruction.writes[i] >= 0) slots_[instruction.writes[i]] = std::move(stack_[i]);
      }
      stack_.clear();
    } else if (instruction.list == ListKind::kTensors) {
      c10::List<at::Tensor> list;
      for (size_t i = 0; i < n; ++i) list.push_back(value(instruction, i)->toTensor());
      slots_[instruction.writes[0]] = c10::IValue(list);
    } else if (instruction.list == ListKind::kOptionalTensors) {
      c10::List<std::optional<at::Tensor>> list;
      for (size_t i = 0; i < n; ++i) list.push_back(value(instruction, i)->toOptional<at::Tensor>());
      slots_[instruction.writes[0]] = c10::IValue(list);
    } else {
      slots_[instruction.writes[0]] = *value(instruction, 0);
    }
  }

  // team_ends_[i]: where the team stretch starting at call i ends, 0 where none starts there. Each call of a
  // stretch whose op has a binder and whose arguments are all constants is bound here, once (is_bound_, bound_).
  void plan_teams() {
    if (team_ends_.size() == code_.size()) return;
    team_ends_.assign(code_.size(), 0);
    is_bound_.assign(code_.size(), 0);
    bound_.assign(code_.size(), BoundCall{});
    for (size_t i = 0; i < code_.size();) {
      size_t end = i, shared = 0;
      while (end < code_.size() && (code_[end].direct != nullptr || joins(code_[end]))) shared += code_[end++].anchors;
      if (shared >= 2) {
        team_ends_[i] = end;
        for (size_t j = i; j < end; ++j) is_bound_[j] = bind(code_[j], bound_[j]);
      }
      i = end > i ? end : i + 1;
    }
  }

  // Binds a call whose arguments are all constants, once.
  static bool bind(const Instruction& instruction, BoundCall& call) {
    if (instruction.bind == nullptr) return false;
    for (const int64_t slot : instruction.reads)
      if (slot >= 0) return false;  // a tensor this run makes: its data moves from run to run
    const c10::IValue* args[kMaxDirectArgs];
    for (size_t i = 0; i < instruction.constants.size(); ++i) args[i] = &instruction.constants[i];
    try {
      return instruction.bind(args, call) && call.run != nullptr;
    } catch (const std::exception&) {  // operands its checks refuse: the direct form raises the error at run
      return false;
    }
  }

  // Calls [begin, end) in one parallel region of `threads`, a barrier after each. A call that throws on any
  // thread skips the rest of the stretch on all of them (they still meet at every barrier), and the first error
  // is raised after the region.
  void run_team(size_t begin, size_t end, int threads) {
    TeamShared shared{{}, &scratch_};
    SpinBarrier& barrier = shared.barrier;
    std::atomic<bool> failed{false};
    std::exception_ptr error;
#pragma omp parallel num_threads(threads)
    {
      const Team team{omp_get_thread_num(), omp_get_num_threads(), &shared};
      for (size_t i = begin; i < end; ++i) {
        const Instruction& instruction = code_[i];
        if (instruction.team_form != nullptr) {
          // A barrier came before this call (it is not alone), so every thread reads the same `failed` here.
          if (!failed.load(std::memory_order_relaxed)) {
            try {
              const c10::IValue* args[kMaxDirectArgs];
              for (size_t j = 0; j < instruction.constants.size(); ++j) args[j] = value(instruction, j);
              instruction.team_form(args, frame::Team{team.thread, team.threads, &shared, form_sync, form_scratch});
            } catch (...) {
              if (!failed.exchange(true)) error = std::current_exception();
            }
          }
        } else if (!failed.load(std::memory_order_relaxed) && bound_on_ && is_bound_[i]) {  // checked when bound: no throw
          run_bound(bound_[i], team);
        } else if (!failed.load(std::memory_order_relaxed)) {
          try {
            const c10::IValue* args[kMaxDirectArgs];
            for (size_t j = 0; j < instruction.constants.size(); ++j) args[j] = value(instruction, j);
            // Each thread binds the same arguments to the same record; where they cannot be shared, the first
            // thread runs the direct form.
            BoundCall call;
            if (instruction.bind != nullptr && instruction.bind(args, call) && call.run != nullptr)
              run_bound(call, team);
            else if (team.thread == 0)
              instruction.direct(args);
          } catch (...) {
            if (!failed.exchange(true)) error = std::current_exception();
          }
        }
        if (i + 1 < end && needs_barrier(i)) barrier.wait(team.threads);
      }
    }
    if (error) std::rethrow_exception(error);
  }

  // Whether the team meets between calls i and i + 1 of a stretch: not where the first thread runs both alone
  // (a lone row's norm, a residual add, rope before attention), as nothing it writes is read by another thread
  // before the next shared call's barrier. Each barrier costs a line's round trip between the cores (370-420 ns
  // across a Zen 5's two CCDs) and a dense SmolLM2 token met about 200 of them.
  bool needs_barrier(size_t i) const { return !(alone(i) && alone(i + 1)); }

  // A call of a team stretch the first thread runs whole: one without a binder (its direct form), or one bound
  // to a record that is not shared. Calls bound at each run may come out either way, so they count as shared.
  bool alone(size_t i) const {
    if (joins(code_[i])) return false;
    if (code_[i].bind == nullptr) return true;
    return bound_on_ && is_bound_[i] && !bound_[i].shared;
  }

  // A call of another library that team stretches take in (and which the team then runs through its form).
  bool joins(const Instruction& instruction) const { return team_forms_ && instruction.team_form != nullptr; }

  // The team form the op `name` offers through `<name>_team_form` (<frame/team_form.h>), or null: none, or one
  // built against another version of the contract.
  static frame::TeamForm find_team_form(const std::string& name) {
    const auto handle = c10::Dispatcher::singleton().findSchema({name + "_team_form", ""});
    if (!handle.has_value() || !handle->schema().arguments().empty()) return nullptr;
    std::vector<c10::IValue> stack;
    handle->callBoxed(stack);
    if (stack.size() != 1 || !stack[0].isIntList()) return nullptr;
    const std::vector<int64_t> form = stack[0].toIntVector();
    if (form.size() != 2 || form[0] != frame::kTeamFormVersion || form[1] == 0) return nullptr;
    return reinterpret_cast<frame::TeamForm>(static_cast<intptr_t>(form[1]));
  }

  static void run_bound(const BoundCall& call, const Team& team) {
    if (call.shared) call.run(call, team);
    else if (team.thread == 0) call.run(call, Team{0, 1});
  }

  const c10::IValue* value(const Instruction& instruction, size_t i) const {
    const int64_t slot = instruction.reads[i];
    return slot < 0 ? &instruction.constants[i] : &slots_[slot];
  }

  // What Python's argument parsing would have made of a constant for this argument, which a boxed call does not
  // do: a number where a Tensor is declared (`x * 2.0` records aten::mul.Tensor with the float) is a wrapped-number
  // tensor, which type promotion treats as the Python scalar it was; a list of tensors, which arrives as Tensor[],
  // is a Tensor?[] where one is declared (aten::index's indices).
  static c10::IValue as_argument(c10::IValue value, const c10::Argument& argument) {
    if (argument.type()->kind() == c10::TypeKind::TensorType && (value.isDouble() || value.isInt() || value.isBool())) {
      at::Tensor wrapped = c10::scalar_to_tensor(value.toScalar());
      wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
      return c10::IValue(wrapped);
    }
    const auto list = argument.type()->cast<c10::ListType>();
    if (!value.isTensorList() || !list || list->getElementType()->kind() != c10::TypeKind::OptionalType) return value;
    c10::List<std::optional<at::Tensor>> optional;
    for (const at::Tensor& tensor : value.toTensorVector()) optional.push_back(tensor);
    return c10::IValue(optional);
  }

  void check_slots(const std::vector<int64_t>& slots) const {
    for (const int64_t slot : slots)
      TORCH_CHECK(slot >= -1 && slot < static_cast<int64_t>(slots_.size()), "slot ", slot, " out of range");
  }

  std::vector<c10::IValue> slots_;
  std::vector<Instruction> code_;
  std::vector<size_t> team_ends_;
  std::vector<char> is_bound_;
  std::vector<BoundCall> bound_;
  std::vector<uint8_t> scratch_;  // what team ops share within a call (team_scratch)
  bool teams_ = true;
  bool bound_on_ = true;
  bool team_forms_ = true;
  std::vector<c10::IValue> stack_;
  c10::IValue output_;
  int64_t output_slot_ = -1;
};

}  // namespace
}  // namespace frame_cpu

TORCH_LIBRARY_FRAGMENT(frame_cpu, m) {
  m.class_<frame_cpu::StepProgram>("StepProgram")
      .def(torch::init<int64_t>())
      .def("call", &frame_cpu::StepProgram::call)
      .def("copy", &frame_cpu::StepProgram::copy)
      .def("make_list", &frame_cpu::StepProgram::make_list)
      .def("set_output", &frame_cpu::StepProgram::set_output)
      .def("num_direct", &frame_cpu::StepProgram::num_direct)
      .def("num_calls", &frame_cpu::StepProgram::num_calls)
      .def("set_teams", &frame_cpu::StepProgram::set_teams)
      .def("num_teams", &frame_cpu::StepProgram::num_teams)
      .def("num_barriers", &frame_cpu::StepProgram::num_barriers)
      .def("describe", &frame_cpu::StepProgram::describe)
      .def("set_bound", &frame_cpu::StepProgram::set_bound)
      .def("num_team_forms", &frame_cpu::StepProgram::num_team_forms)
      .def("set_team_forms", &frame_cpu::StepProgram::set_team_forms)
      .def("num_bound", &frame_cpu::StepProgram::num_bound)
      .def("run", &frame_cpu::StepProgram::run);
}
