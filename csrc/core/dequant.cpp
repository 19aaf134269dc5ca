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

}  // namespace

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
