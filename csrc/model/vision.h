// The qwen4_exp vision tower (transformers 5.24 Qwen4ExpVisionModel, a Qwen3-VL ViT) from a projector GGUF in
// llama.cpp's layout (clip.projector_type "qwen3vl_merger"): patch embedding, the learned position grid
// resampled bilinearly to each image, 2-D rotary attention within each frame, GELU MLP blocks, and the patch
// merger that turns each merge x merge block of patches into one text-model embedding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/buffers.h"
#include "core/gguf_set.h"
#include "model/weights.h"

namespace regolith {

struct VisionConfig {
    int64_t hidden = 0;        // clip.vision.embedding_length
    int64_t ff = 0;            // clip.vision.feed_forward_length
    int64_t n_layer = 0;       // clip.vision.block_count
    int64_t n_head = 0;        // clip.vision.attention.head_count
    int64_t patch = 0;         // clip.vision.patch_size
    int64_t merge = 2;         // clip.vision.spatial_merge_size
    int64_t temporal = 2;      // temporal patch size: the frames one patch spans (v.patch_embd.weight{,.1})
    int64_t channels = 3;
    int64_t out_dim = 0;       // clip.vision.projection_dim: the text model's hidden size
    int64_t grid_side = 0;     // sqrt(rows of v.position_embd.weight)
    float eps = 1e-6f;         // clip.vision.attention.layer_norm_epsilon
    float rope_theta = 10000.0f;

    int64_t head_dim() const { return hidden / n_head; }
    int64_t patch_dim() const { return channels * temporal * patch * patch; }  // one pixel row
    static VisionConfig from_gguf(const GgufSet& file);
};

class VisionEncoder {
public:
    // Maps and validates a projector GGUF. Throws GGUFError / ModelFormatError.
    explicit VisionEncoder(const std::string& path, Backend& backend = cpu_backend());
    ~VisionEncoder();

    const VisionConfig& config() const { return config_; }
    // Bytes of the weights it holds (in the backend's memory, or mapped from the file).
    uint64_t weight_bytes() const { return store_.bytes(); }

    // pixels: [sum t*h*w][patch_dim] rows in the processor's order (per image, merge x merge blocks of
    // patches in raster order of blocks; each row is (channel, frame, y, x)); grids: [n_images][3] (t, h, w)
    // in patches, h and w multiples of merge. out: [sum t*h*w / merge^2][out_dim]. Host memory both.
    void encode(const float* pixels, const int64_t* grids, int64_t n_images, float* out) const;

private:
    struct Block {
        Tensor ln1_w, ln1_b, ln2_w, ln2_b;
        Tensor qkv, out, up, down;  // [3*hidden][hidden], [hidden][hidden], [ff][hidden], [hidden][ff]
        Tensor qkv_b, out_b, up_b, down_b;
    };
    struct Scratch;
    void encode_image(Workspace& ws, const float* pixels, int64_t t, int64_t h, int64_t w, float* out) const;
    void attention(const Block& b, const Tensor& x, const Tensor& rope, const Tensor& y, const Scratch& sc) const;
    void linear(const Tensor& w, const Tensor& b, const Tensor& x, const Tensor& y) const;

    GgufSet file_;
    Backend& backend_;
    WeightStore store_;
    VisionConfig config_;
    Tensor patch_w_;   // [hidden][channels * temporal * patch * patch]
    Tensor patch_b_;   // [hidden]
    Tensor pos_embd_;  // [grid_side^2][hidden]
    Tensor rope_freq_, rope_axis_;  // [1][head_dim / 2]: 2-D rotary pairs (rows, then columns)
    std::vector<Block> blocks_;
    Tensor post_w_, post_b_;  // merger norm [hidden]
    Tensor mm0_, mm2_;        // [4h][4h], [out_dim][4h]
    Tensor mm0_b_, mm2_b_;
};

}  // namespace regolith
