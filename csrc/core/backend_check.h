// The backend conformance suite (ggml's test-backend-ops idea): every op of core/backend.h over many shapes
// and types, run on a backend and on the CPU reference from the same seeded inputs, each output compared by
// normalized mean squared error  NMSE = sum (y - y_ref)^2 / sum y_ref^2  against a tolerance stated per op
// (integer outputs must match exactly). The suite is the specification a new backend is written against: a
// new op lands with its cases here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"

namespace regolith {

struct OpCheck {
    std::string op;     // the Backend op, e.g. "matmul"
    std::string shape;  // the case: types and sizes
    double nmse = 0.0;  // the largest over the case's outputs (0 for exact integer matches)
    double tolerance = 0.0;
    bool passed = false;
    std::string error;  // a failure to run or an integer mismatch
    std::string skipped;  // why the case did not run (a cache type the backend refuses); passed is then true
};

// Runs every case whose op name contains `filter` (all for "") on `be` and on `ref`, the inputs drawn from
// `seed` (`ref_seed` for the reference: another seed checks that every case compares inputs-dependent
// outputs, as then none may pass).
std::vector<OpCheck> check_backend(Backend& be, Backend& ref, const std::string& filter = "", uint64_t seed = 1,
                                   uint64_t ref_seed = 0);

}  // namespace regolith
