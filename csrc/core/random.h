// A seeded pseudo-random generator that gives the same sequence on every platform: xoshiro256** 1.0
// (Blackman & Vigna, https://prng.di.unimi.it/xoshiro256starstar.c), its 256-bit state filled with four
// outputs of splitmix64 (https://prng.di.unimi.it/splitmix64.c) from the 64-bit seed, as its authors
// recommend.
#pragma once

#include <cstdint>

namespace regolith {

class Xoshiro256 {
  public:
    explicit Xoshiro256(uint64_t seed) { reseed(seed); }

    void reseed(uint64_t seed) {
        for (uint64_t& s : s_) {
            seed += 0x9e3779b97f4a7c15ull;
            uint64_t z = seed;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            s = z ^ (z >> 31);
        }
    }

    uint64_t next() {
        const uint64_t result = rotl(s_[1] * 5, 7) * 9;
        const uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return result;
    }

    // The top 53 bits as k * 2^-53: each of the 2^53 doubles k/2^53 in [0, 1) equally likely, exactly.
    double uniform() { return double(next() >> 11) * 0x1.0p-53; }

  private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
};

}  // namespace regolith
