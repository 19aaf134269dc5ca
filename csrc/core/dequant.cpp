#include "core/dequant.h"

#include <cstring>
#include <string>

#include "core/block_decode.h"
#include "core/errors.h"
#include "core/half.h"
#include "core/types.h"

namespace regolith {
namespace {

// One block at a time through the decoder: x = scale * q (+ bias), one rounding each, as the contract.
template <class D>
void dequantize_blocks(const uint8_t* src, float* dst, int64_t n_blocks) {
    alignas(64) int8_t q[D::QK];
    float scale[D::NG];
    float bias[D::NG] = {};
    for (int64_t i = 0; i < n_blocks; ++i, src += sizeof(typename D::Block), dst += D::QK) {
        typename D::Block b;  // copied: src may be unaligned for the block's uint16/float fields
        std::memcpy(&b, src, sizeof b);
        D::decode(b, q, scale, bias);
        for (int g = 0; g < D::NG; ++g) {
            const float s = scale[g];
            const int8_t* qg = q + g * D::G;
            float* y = dst + g * D::G;
            if constexpr (D::HAS_BIAS) {
                const float m = bias[g];
                for (int j = 0; j < D::G; ++j) y[j] = s * float(qg[j]) + m;
            } else {
                for (int j = 0; j < D::G; ++j) y[j] = s * float(qg[j]);
            }
        }
    }
}

// As dequantize_blocks, through the decoder's 32-element parts (decode_part).
template <class D>
void dequantize_parts(const uint8_t* src, float* dst, int64_t n_blocks) {
    int8_t q[32];
    float scale[32 / D::G];
    float bias[32 / D::G] = {};
    for (int64_t i = 0; i < n_blocks; ++i, src += sizeof(typename D::Block)) {
        typename D::Block b;
        std::memcpy(&b, src, sizeof b);
        for (int c = 0; c < D::QK / 32; ++c, dst += 32) {
            D::decode_part(b, c, q, scale, bias);
            for (int j = 0; j < 32; ++j) {
                const int g = j / D::G;
                dst[j] = D::HAS_BIAS ? scale[g] * float(q[j]) + bias[g] : scale[g] * float(q[j]);
            }
        }
    }
}

}  // namespace

std::vector<uint32_t> part_decoded_types() {
    std::vector<uint32_t> out;
#define RG_PART_(T) \
    if (has_decode_part<BlockDecoder<T>>::value) out.push_back(T);
    RG_FOR_EACH_QUANT_TYPE(RG_PART_)
#undef RG_PART_
    return out;
}

void dequantize_row_by_parts(uint32_t type, const void* src, float* dst, int64_t n) {
    const TypeTraits* t = type_traits(type);
    if (!t || !is_quant_type(type)) throw Error("dequantize by parts: unknown quantized type id " + std::to_string(type));
    if (n < 0 || n % t->block_elems != 0)
        throw Error(std::string(t->name) + ": element count " + std::to_string(n) +
                    " is not a multiple of the block size " + std::to_string(t->block_elems));
    dispatch_quant_type(type, [&](auto dec) {
        using D = decltype(dec);
        if constexpr (has_decode_part<D>::value)
            dequantize_parts<D>(static_cast<const uint8_t*>(src), dst, n / D::QK);
        else
            throw Error(std::string(t->name) + " has no 32-element part decoder");
    });
}

void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n) {
    const TypeTraits* t = type_traits(type);
    if (!t) throw Error("unknown ggml type id " + std::to_string(type));
    if (n < 0 || n % t->block_elems != 0)
        throw Error(std::string(t->name) + ": element count " + std::to_string(n) +
                    " is not a multiple of the block size " + std::to_string(t->block_elems));
    const auto* s = static_cast<const uint8_t*>(src);
    switch (type) {
        case RG_TYPE_F32:
            std::memcpy(dst, s, size_t(n) * 4);
            return;
        case RG_TYPE_F16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, s + 2 * i, 2);
                dst[i] = fp16_to_fp32(h);
            }
            return;
        case RG_TYPE_BF16:
            for (int64_t i = 0; i < n; ++i) {
                uint16_t h;
                std::memcpy(&h, s + 2 * i, 2);
                dst[i] = bf16_to_fp32(h);
            }
            return;
        default:
            break;
    }
    if (!is_quant_type(type))
        throw Error(std::string("dequantize: type ") + std::string(t->name) + " is not supported");
    dispatch_quant_type(type, [&](auto dec) {
        using D = decltype(dec);
        dequantize_blocks<D>(s, dst, n / D::QK);
    });
}

}  // namespace regolith
