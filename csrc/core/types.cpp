#include "types.h"

namespace regolith {
namespace {

constexpr int64_t kHalf = 2;

// Indexed by GGUF type id. Q8_1 (a transient activation format, never stored in files) and the integer
// types are listed so a reader can report them; `supported` says what the kernels handle.
constexpr TypeTraits kTraits[RG_TYPE_COUNT] = {
    /* 0 F32     */ {"F32", 1, 4, true},
    /* 1 F16     */ {"F16", 1, 2, true},
    /* 2 Q4_0    */ {"Q4_0", QK4_0, sizeof(block_q4_0), true},
    /* 3 Q4_1    */ {"Q4_1", QK4_1, sizeof(block_q4_1), true},
    /* 4         */ {},
    /* 5         */ {},
    /* 6 Q5_0    */ {"Q5_0", QK5_0, sizeof(block_q5_0), true},
    /* 7 Q5_1    */ {"Q5_1", QK5_1, sizeof(block_q5_1), true},
    /* 8 Q8_0    */ {"Q8_0", QK8_0, sizeof(block_q8_0), true},
    /* 9 Q8_1    */ {"Q8_1", QK8_1, 4 * kHalf + QK8_1, false},
    /* 10 Q2_K   */ {"Q2_K", QK_K, sizeof(block_q2_K), true},
    /* 11 Q3_K   */ {"Q3_K", QK_K, sizeof(block_q3_K), true},
    /* 12 Q4_K   */ {"Q4_K", QK_K, sizeof(block_q4_K), true},
    /* 13 Q5_K   */ {"Q5_K", QK_K, sizeof(block_q5_K), true},
    /* 14 Q6_K   */ {"Q6_K", QK_K, sizeof(block_q6_K), true},
    /* 15 Q8_K   */ {"Q8_K", QK_K, sizeof(block_q8_K), true},
    /* 16 IQ2_XXS*/ {"IQ2_XXS", QK_K, sizeof(block_iq2_xxs), true},
    /* 17 IQ2_XS */ {"IQ2_XS", QK_K, sizeof(block_iq2_xs), true},
    /* 18 IQ3_XXS*/ {"IQ3_XXS", QK_K, sizeof(block_iq3_xxs), true},
    /* 19 IQ1_S  */ {"IQ1_S", QK_K, sizeof(block_iq1_s), true},
    /* 20 IQ4_NL */ {"IQ4_NL", QK4_NL, sizeof(block_iq4_nl), true},
    /* 21 IQ3_S  */ {"IQ3_S", QK_K, sizeof(block_iq3_s), true},
    /* 22 IQ2_S  */ {"IQ2_S", QK_K, sizeof(block_iq2_s), true},
    /* 23 IQ4_XS */ {"IQ4_XS", QK_K, sizeof(block_iq4_xs), true},
    /* 24 I8     */ {"I8", 1, 1, false},
    /* 25 I16    */ {"I16", 1, 2, false},
    /* 26 I32    */ {"I32", 1, 4, false},
    /* 27 I64    */ {"I64", 1, 8, false},
    /* 28 F64    */ {"F64", 1, 8, false},
    /* 29 IQ1_M  */ {"IQ1_M", QK_K, sizeof(block_iq1_m), true},
    /* 30 BF16   */ {"BF16", 1, 2, true},
    /* 31        */ {},
    /* 32        */ {},
    /* 33        */ {},
    /* 34 TQ1_0  */ {"TQ1_0", QK_K, sizeof(block_tq1_0), true},
    /* 35 TQ2_0  */ {"TQ2_0", QK_K, sizeof(block_tq2_0), true},
    /* 36        */ {},
    /* 37        */ {},
    /* 38        */ {},
    /* 39 MXFP4  */ {"MXFP4", QK_MXFP4, sizeof(block_mxfp4), true},
    /* 40 NVFP4  */ {"NVFP4", QK_NVFP4, sizeof(block_nvfp4), true},
    /* 41 Q1_0   */ {"Q1_0", QK1_0, sizeof(block_q1_0), true},
    /* 42 Q2_0   */ {"Q2_0", QK2_0, sizeof(block_q2_0), true},
};

}  // namespace

const TypeTraits* type_traits(uint32_t type_id) {
    if (type_id >= RG_TYPE_COUNT || kTraits[type_id].block_elems == 0) return nullptr;
    return &kTraits[type_id];
}

int type_from_name(std::string_view name) {
    for (int i = 0; i < RG_TYPE_COUNT; ++i)
        if (kTraits[i].block_elems != 0 && kTraits[i].name == name) return i;
    return -1;
}

}  // namespace regolith
