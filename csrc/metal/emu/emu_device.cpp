// The emulated Metal device: buffers are host memory, dispatches are recorded into command buffers, and a
// committed command buffer runs only when somebody waits for it (a read, a fence), on the waiting thread.
// That is as late as a GPU may run it, so a core that touches memory before waiting for the work that uses
// it sees the difference in tests, deterministically.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/errors.h"
#include "metal/device.h"
#include "metal/emu/kernel_registry.h"

namespace regolith::metal_emu {

namespace {

std::unordered_map<std::string, KernelEntry>& registry() {
    static std::unordered_map<std::string, KernelEntry> r;
    return r;
}

}  // namespace

void register_kernel(const char* name, KernelRun run, int n_buffers) {
    registry()[name] = KernelEntry{run, n_buffers};
}

const KernelEntry* find_kernel(const char* name) {
    auto it = registry().find(name);
    return it == registry().end() ? nullptr : &it->second;
}

namespace {

constexpr uint32_t kMaxThreadgroupMemory = 32 * 1024;
constexpr int kMaxBufferArguments = 31;
constexpr uint32_t kMaxSetBytes = 4096;

class EmuBuffer final : public metal::DeviceBuffer {
  public:
    EmuBuffer(uint8_t* p, bool owned) : p_(p), owned_(owned) {}
    ~EmuBuffer() override {
        if (owned_) std::free(p_);
    }
    uint8_t* contents() override { return p_; }

  private:
    uint8_t* p_;
    bool owned_;
};

struct Command {
    const KernelEntry* kernel;
    std::string name;
    metal::Launch launch;
    std::vector<uint8_t*> bindings;
    std::vector<std::vector<uint8_t>> bytes;  // setBytes arguments, copied when encoded
};

struct CommandBuffer {
    uint64_t serial = 0;
    std::vector<Command> commands;
};

class EmuDevice final : public metal::Device {
  public:
    void retire() override {
        std::lock_guard<std::mutex> run_lock(run_mu_);
        std::lock_guard<std::mutex> lock(queue_mu_);
        queue_.clear();
        current_ = CommandBuffer{};
        completed_ = last_serial_;
    }
    const char* name() const override { return "metal-emu"; }
    std::string description() const override { return "a Metal GPU emulated on the CPU"; }

    metal::DeviceBuffer* new_buffer(uint64_t bytes) override {
        const size_t n = size_t((std::max<uint64_t>(bytes, 1) + 4095) / 4096 * 4096);
        auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, n));
        if (!p) throw Error("metal emulator: cannot allocate " + std::to_string(bytes) + " bytes");
        std::memset(p, 0xff, n);  // undefined contents: NaN floats, -1 integers
        return new EmuBuffer(p, true);
    }
    metal::DeviceBuffer* wrap(void* p, uint64_t) override {
        return new EmuBuffer(static_cast<uint8_t*>(p), false);
    }

    uint32_t max_threads(const char*) override { return kMaxThreadsPerGroup; }

    void dispatch(const metal::Launch& l, const metal::KernelArg* args, int n_args) override {
        const KernelEntry* k = find_kernel(l.kernel);
        if (!k) throw Error(std::string("metal emulator: no kernel named ") + l.kernel);
        // Metal's limits on every Apple GPU: what the emulator would run, a GPU would refuse.
        const auto refuse = [&](const std::string& what) {
            throw Error(std::string("metal emulator: kernel ") + l.kernel + ": " + what);
        };
        if (l.shmem > kMaxThreadgroupMemory)
            refuse(std::to_string(l.shmem) + " bytes of threadgroup memory (Metal allows 32 KiB)");
        if (n_args > kMaxBufferArguments)
            refuse(std::to_string(n_args) + " buffers (Metal binds at most 31)");
        for (int i = 0; i < n_args; ++i)
            if (args[i].bytes && args[i].size > kMaxSetBytes)
                refuse("argument " + std::to_string(i) + " of " + std::to_string(args[i].size) +
                       " bytes (setBytes takes at most 4 KiB)");
        if (n_args != k->n_buffers)
            throw Error(std::string("metal emulator: kernel ") + l.kernel + " takes " +
                        std::to_string(k->n_buffers) + " buffers, dispatched with " + std::to_string(n_args));
        Command c{k, l.kernel, l, {}, {}};
        c.launch.kernel = nullptr;
        c.bytes.reserve(size_t(n_args));
        for (int i = 0; i < n_args; ++i) {
            const metal::KernelArg& a = args[i];
            if (a.bytes) {
                const auto* b = static_cast<const uint8_t*>(a.bytes);
                c.bytes.emplace_back(b, b + a.size);
                c.bindings.push_back(c.bytes.back().data());
            } else {
                c.bindings.push_back(a.buffer->contents() + a.offset);
            }
        }
        current_.commands.push_back(std::move(c));
    }

    uint64_t commit() override {
        std::lock_guard<std::mutex> lock(queue_mu_);
        if (current_.commands.empty()) return last_serial_;
        current_.serial = ++last_serial_;
        queue_.push_back(std::move(current_));
        current_ = CommandBuffer{};
        return last_serial_;
    }

    void wait(uint64_t serial) override {
        std::lock_guard<std::mutex> run_lock(run_mu_);
        run_until(serial);
        if (error_) {
            std::exception_ptr e = error_;
            error_ = nullptr;
            std::rethrow_exception(e);
        }
    }

    void finish(uint64_t serial) override {
        std::lock_guard<std::mutex> run_lock(run_mu_);
        run_until(serial);
    }

    uint64_t completed() override {
        std::lock_guard<std::mutex> lock(queue_mu_);
        return completed_;
    }

  private:
    // Runs the committed command buffers up to `serial` on this thread (run_mu_ held), keeping the first
    // failure in error_.
    void run_until(uint64_t serial) {
        for (;;) {
            CommandBuffer cb;
            {
                std::lock_guard<std::mutex> lock(queue_mu_);
                if (completed_ >= serial || queue_.empty()) break;
                cb = std::move(queue_.front());
                queue_.pop_front();
            }
            try {
                for (const Command& c : cb.commands)
                    c.kernel->run(c.name.c_str(), c.bindings.data(), c.launch.groups, c.launch.threads,
                                  c.launch.shmem);
            } catch (...) {
                if (!error_) error_ = std::current_exception();
            }
            std::lock_guard<std::mutex> lock(queue_mu_);
            completed_ = cb.serial;
        }
    }

    CommandBuffer current_;  // being encoded (the backend serialises encoders)
    std::mutex queue_mu_;    // the queue, the serials
    std::mutex run_mu_;      // command buffers run one at a time, in order
    std::deque<CommandBuffer> queue_;
    uint64_t last_serial_ = 0, completed_ = 0;
    std::exception_ptr error_;  // a command buffer's failure, for the next wait
};

}  // namespace

}  // namespace regolith::metal_emu

namespace regolith::metal {

std::unique_ptr<Device> emulated_device() { return std::make_unique<metal_emu::EmuDevice>(); }

}  // namespace regolith::metal
