// The emulator's kernel library: every kernel of metal/*.metal, compiled as C++, under the name the Metal
// library gives it. A kernel's parameters are its buffers, bound in order ([[buffer(0)]], [[buffer(1)]],
// ...), then RG_THREAD_IDS (metal/compat.h): threadgroup position, thread index, SIMD-group index, lane,
// threads per threadgroup and the threadgroup memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "metal/emu/msl.h"
#include "metal/emu/threadgroup.h"

namespace regolith::metal_emu {

// Runs a dispatch of a kernel with `bindings[i]` the address bound at index i.
using KernelRun = void (*)(const char* name, uint8_t* const* bindings, const uint32_t grid[3],
                           uint32_t threads, uint32_t shmem);
struct KernelEntry {
    KernelRun run = nullptr;
    int n_buffers = 0;
};
void register_kernel(const char* name, KernelRun run, int n_buffers);
// Null for a name no kernel has.
const KernelEntry* find_kernel(const char* name);

template <class F>
struct KernelSignature;
template <class... P>
struct KernelSignature<void (*)(P...)> {
    static constexpr int kIds = 7;  // the parameters of RG_THREAD_IDS
    static constexpr int kBuffers = int(sizeof...(P)) - kIds;
    using Params = std::tuple<P...>;
};

// Calls the kernel Fn for one thread: its buffer parameters from the bindings (pointers as they are,
// references to the bound bytes), then the thread's ids.
template <auto Fn>
struct KernelAdapter {
    using Sig = KernelSignature<decltype(Fn)>;
    static constexpr int kBuffers = Sig::kBuffers;
    static_assert(kBuffers >= 0, "a kernel ends with RG_THREAD_IDS");

    template <class P>
    static P bind(uint8_t* p) {
        if constexpr (std::is_pointer_v<P>) {
            return reinterpret_cast<P>(p);
        } else {
            static_assert(std::is_reference_v<P>, "kernel buffers are pointers or references");
            return *reinterpret_cast<std::remove_reference_t<P>*>(p);
        }
    }
    template <size_t... I>
    static void call(uint8_t* const* b, const ThreadIds& ids, std::index_sequence<I...>) {
        Fn(bind<std::tuple_element_t<I, typename Sig::Params>>(b[I])...,
           msl::uint3(ids.tgpig[0], ids.tgpig[1], ids.tgpig[2]), ids.tiitg, ids.sgitg, ids.tiisg, ids.ntg,
           msl::uint3(ids.tgpg[0], ids.tgpg[1], ids.tgpg[2]), reinterpret_cast<char*>(ids.shmem));
    }
    static void body(const void* ctx, const ThreadIds& ids) {
        call(static_cast<uint8_t* const*>(ctx), ids, std::make_index_sequence<size_t(kBuffers)>{});
    }
    static void run(const char* name, uint8_t* const* bindings, const uint32_t grid[3], uint32_t threads,
                    uint32_t shmem) {
        run_grid(name, grid, threads, shmem, &body, bindings);
    }
};

struct KernelRegistration {
    KernelRegistration(const char* name, KernelRun run, int n_buffers) {
        register_kernel(name, run, n_buffers);
    }
};

}  // namespace regolith::metal_emu

#define RG_EMU_CAT2(a, b) a##b
#define RG_EMU_CAT(a, b) RG_EMU_CAT2(a, b)
// Registers the kernel function `...` (a function or a template's specialisation) under `name`.
#define RG_EMU_REGISTER(name, ...)                                                                  \
    static const ::regolith::metal_emu::KernelRegistration RG_EMU_CAT(rg_emu_kernel_, __COUNTER__)( \
        name, &::regolith::metal_emu::KernelAdapter<&__VA_ARGS__>::run,                             \
        ::regolith::metal_emu::KernelAdapter<&__VA_ARGS__>::kBuffers);
