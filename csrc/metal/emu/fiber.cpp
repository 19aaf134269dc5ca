#include "metal/emu/fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <system_error>

#include "core/errors.h"

#if defined(__x86_64__) || defined(__aarch64__)
#define RG_FIBER_ASM 1
#else
#include <ucontext.h>
#endif

#if defined(__APPLE__)
#define RG_SYM(name) "_" #name
#define RG_FN_TYPE(name)
#else
#define RG_SYM(name) #name
#define RG_FN_TYPE(name) ".type " #name ",@function\n"
#endif

#if defined(RG_FIBER_ASM)
// rg_emu_switch(save, load): pushes the callee-saved registers, stores the stack pointer in *save, loads
// `load` as the stack pointer and pops the registers saved there. rg_emu_start is where a new fiber's first
// switch returns to: it calls fn(arg) from the registers start() placed in its frame.
extern "C" void rg_emu_switch(void** save, void* load);
extern "C" void rg_emu_start();

#if defined(__x86_64__)
// Frame (8-byte slots, from the saved stack pointer up): MXCSR and the x87 control word, r15, r14, r13, r12,
// rbx, rbp, return address.
asm(".text\n"
    ".globl " RG_SYM(rg_emu_switch) "\n" RG_FN_TYPE(rg_emu_switch)
    RG_SYM(rg_emu_switch) ":\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
    "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
    "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".globl " RG_SYM(rg_emu_start) "\n" RG_FN_TYPE(rg_emu_start)
    RG_SYM(rg_emu_start) ":\n"
    "  movq %r12, %rdi\n  callq *%r13\n  ud2\n");
constexpr int kFrameSlots = 8;
#else
// Frame (from the saved stack pointer up): x19-x28, x29, x30 (the return address), d8-d15.
asm(".text\n"
    ".globl " RG_SYM(rg_emu_switch) "\n" RG_FN_TYPE(rg_emu_switch)
    ".p2align 2\n"
    RG_SYM(rg_emu_switch) ":\n"
    "  sub sp, sp, #160\n"
    "  stp x19, x20, [sp, #0]\n  stp x21, x22, [sp, #16]\n  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n  stp x27, x28, [sp, #64]\n  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n  stp d10, d11, [sp, #112]\n  stp d12, d13, [sp, #128]\n  stp d14, d15, [sp, #144]\n"
    "  mov x2, sp\n  str x2, [x0]\n  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n  ldp x21, x22, [sp, #16]\n  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n  ldp x27, x28, [sp, #64]\n  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n  ldp d10, d11, [sp, #112]\n  ldp d12, d13, [sp, #128]\n  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #160\n"
    "  ret\n"
    ".globl " RG_SYM(rg_emu_start) "\n" RG_FN_TYPE(rg_emu_start)
    ".p2align 2\n"
    RG_SYM(rg_emu_start) ":\n"
    "  mov x0, x19\n  blr x20\n  brk #0\n");
constexpr int kFrameSlots = 20;
#endif
#endif

namespace regolith::metal_emu {

FiberStack::FiberStack(size_t bytes) {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    guard_ = page;
    size_ = guard_ + (bytes + page - 1) / page * page;
    void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        throw std::system_error(errno, std::generic_category(), "metal emulator: fiber stack");
    base_ = static_cast<uint8_t*>(p);
    mprotect(base_, guard_, PROT_NONE);
}

FiberStack::~FiberStack() { munmap(base_, size_); }

#if defined(RG_FIBER_ASM)
struct Fiber::Impl {
    void* sp = nullptr;
};

void Fiber::start(FiberStack& stack, void (*fn)(void*), void* arg) {
    // The frame rg_emu_switch pops, ending 16-byte aligned where rg_emu_start begins.
    auto top = reinterpret_cast<uintptr_t>(stack.top()) & ~uintptr_t(15);
    auto* frame = reinterpret_cast<uint64_t*>(top - kFrameSlots * 8);
    std::memset(frame, 0, kFrameSlots * 8);
#if defined(__x86_64__)
    uint32_t mxcsr = 0;
    uint16_t fpcw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpcw));
    frame[0] = uint64_t(mxcsr) | (uint64_t(fpcw) << 32);
    frame[3] = reinterpret_cast<uint64_t>(fn);   // r13
    frame[4] = reinterpret_cast<uint64_t>(arg);  // r12
    frame[7] = reinterpret_cast<uint64_t>(&rg_emu_start);
#else
    frame[0] = reinterpret_cast<uint64_t>(arg);             // x19
    frame[1] = reinterpret_cast<uint64_t>(fn);              // x20
    frame[11] = reinterpret_cast<uint64_t>(&rg_emu_start);  // x30
#endif
    impl_->sp = frame;
}

void Fiber::swap(Fiber& from, Fiber& to) { rg_emu_switch(&from.impl_->sp, to.impl_->sp); }
#else
struct Fiber::Impl {
    ucontext_t ctx;
    void (*fn)(void*) = nullptr;
    void* arg = nullptr;
};

namespace {
// makecontext passes int arguments: the Impl's address in two halves.
void ucontext_entry(unsigned lo, unsigned hi) {
    auto* impl = reinterpret_cast<Fiber::Impl*>((uintptr_t(hi) << 32) | lo);
    impl->fn(impl->arg);
}
}  // namespace

void Fiber::start(FiberStack& stack, void (*fn)(void*), void* arg) {
    if (getcontext(&impl_->ctx) != 0) throw Error("metal emulator: getcontext failed");
    impl_->ctx.uc_stack.ss_sp = stack.bottom();
    impl_->ctx.uc_stack.ss_size = stack.size();
    impl_->ctx.uc_link = nullptr;
    impl_->fn = fn;
    impl_->arg = arg;
    const auto p = uint64_t(reinterpret_cast<uintptr_t>(impl_.get()));
    makecontext(&impl_->ctx, reinterpret_cast<void (*)()>(&ucontext_entry), 2, unsigned(p & 0xffffffffu),
                unsigned(p >> 32));
}

void Fiber::swap(Fiber& from, Fiber& to) { swapcontext(&from.impl_->ctx, &to.impl_->ctx); }
#endif

Fiber::Fiber() : impl_(std::make_unique<Impl>()) {}
Fiber::~Fiber() = default;

}  // namespace regolith::metal_emu
