// Categorical preprocessing layers (Keras 3's names, keys and defaults):
// CategoryEncoding, Hashing and IntegerLookup. They take integer ids (any
// integer dtype; floating inputs are truncated to int64, as Keras does) and
// return int64 ids (output_mode "int") or float encodings in the compute
// dtype ("one_hot", "multi_hot", "count").
//
// Encodings (Keras's encode_categorical_inputs), ids in [0, depth):
//   one_hot    (N,) or (N, 1) -> (N, depth); (N, k) -> (N, k, depth)
//   multi_hot  (N, k) -> (N, depth), 1 where an id occurs
//   count      (N, k) -> (N, depth), how often each id occurs
//   Inputs of rank > 2 are refused, as in Keras. A rank-1 input (N,) is
//   one id per sample in every mode (Keras 3 would treat a rank-1 tensor as
//   a single sample in multi_hot/count; kiln layers keep the batch axis).
//
// CategoryEncoding(num_tokens, output_mode="multi_hot", sparse=false):
//   ids outside [0, num_tokens) are a ValueError naming the value.
//
// Hashing(num_bins, mask_value=null, salt=null, output_mode="int",
//   sparse=false): id -> hash(decimal string of the id) % num_bins, as Keras
//   (which hashes tf.strings.as_string of integer inputs). A string tensor
//   (kiln/core/string_tensor.h; an Input of dtype "string") hashes its
//   strings, output of its logical shape; so a uint8 input is read as
//   strings (cast small integer ids to int32 first). Without salt the
//   hash is FarmHash Fingerprint64 (to_hash_bucket_fast); with salt (an int
//   k, meaning [k, k], or [k0, k1]) it is SipHash-2-4 keyed (k0, k1)
//   (to_hash_bucket_strong). Both match Keras bit for bit on the values
//   checked (string_hash.h). With mask_value, inputs equal to it map to 0
//   and the others to 1 + hash % (num_bins - 1). hash_strings() hashes
//   a std::vector<std::string> the same way, for a data pipeline.
//
// IntegerLookup(max_tokens=null, num_oov_indices=1, mask_token=null,
//   oov_token=-1, vocabulary=null, vocabulary_dtype="int64",
//   idf_weights=null, invert=false, output_mode="int", sparse=false,
//   pad_to_max_tokens=false). Index layout (output_mode "int"):
//   [mask_token -> 0, if set] [num_oov_indices OOV ids] [vocabulary...].
//   An id not in the vocabulary maps to the OOV id oov_start + id mod
//   num_oov_indices (Keras's default for integer keys); num_oov_indices=0
//   makes OOV inputs an error. invert=true maps indices back to tokens (OOV
//   indices and unknown indices to oov_token, 0 to mask_token when set).
//   Other output modes encode the index with depth vocabulary_size() (or
//   max_tokens with pad_to_max_tokens), without a mask slot: mask tokens are
//   dropped. adapt(data) replaces the vocabulary with the distinct values of
//   `data` (mask and OOV tokens excluded) sorted by descending frequency,
//   ties by descending value (Keras's np.lexsort order), at most
//   max_tokens - (reserved ids) of them. The vocabulary (given or adapted)
//   is written to get_config()["vocabulary"], so it saves and loads with the
//   model. Unsupported (ValueError): a vocabulary file path, idf_weights /
//   "tf_idf", sparse=true.
//
//   auto lookup = std::make_shared<IntegerLookup>(IntegerLookupOptions{.num_oov_indices = 1});
//   lookup->adapt(at::tensor({12, 36, 12, 1138}));   // vocabulary [12, 1138, 36]
//   (*lookup)(at::tensor({{12}, {36}, {7}}));         // [[1], [3], [0]]
//
// Thread safety: adapt() must not race with calls; calls may run
// concurrently.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

// Encodes int64 ids (each in [0, depth)) as above; `owner` names the layer
// in errors. `drop` (optional, bool, same shape) marks ids to leave out.
at::Tensor encode_categorical(const at::Tensor& ids, int64_t depth, const std::string& mode, at::ScalarType dtype,
                              const std::string& owner, const at::Tensor& drop = at::Tensor());
// The shape encode_categorical gives for an input shape.
Shape encoded_shape(const Shape& input, int64_t depth, const std::string& mode, const std::string& owner);
// The strings of a string tensor (kiln/core/string_tensor.h; any device) a
// layer received, row-major; ValueError naming `owner` for another dtype.
std::vector<std::string> string_input(const at::Tensor& x, const std::string& owner);

namespace layers {

struct CategoryEncodingOptions {
  int64_t num_tokens = 0;                 // required, > 0
  std::string output_mode = "multi_hot";  // "one_hot", "multi_hot" or "count"
  bool sparse = false;                    // must be false: kiln has no sparse tensors
  LayerOptions base;
};

struct HashingOptions {
  int64_t num_bins = 0;             // required, > 0
  Json mask_value = nullptr;        // null, an integer or a string
  Json salt = nullptr;              // null, k (meaning [k, k]) or [k0, k1], non-negative; written as the pair
  std::string output_mode = "int";  // "int", "one_hot", "multi_hot" or "count"
  bool sparse = false;              // must be false
  LayerOptions base;
};

struct IntegerLookupOptions {
  std::optional<int64_t> max_tokens;  // unset: no limit; > 1
  int64_t num_oov_indices = 1;        // >= 0
  std::optional<int64_t> mask_token;
  int64_t oov_token = -1;
  std::vector<int64_t> vocabulary;  // empty: none (adapt() learns one)
  bool invert = false;              // only with output_mode "int"
  std::string output_mode = "int";  // "int", "one_hot", "multi_hot" or "count"
  bool sparse = false;              // must be false
  bool pad_to_max_tokens = false;   // needs max_tokens
  LayerOptions base;
};

class CategoryEncodingImpl : public SimpleLayer {
 public:
  explicit CategoryEncodingImpl(const CategoryEncodingOptions& options);
  explicit CategoryEncodingImpl(const Json& config);
  CategoryEncodingImpl(int64_t num_tokens, const std::string& output_mode, const Json& extra = Json::object());
  std::string class_name() const override { return "CategoryEncoding"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  CategoryEncodingImpl(const CategoryEncodingOptions& options, const Json& base_config);
  static CategoryEncodingOptions options_from_config(const Json& config);
  CategoryEncodingOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(CategoryEncoding, CategoryEncodingOptions);

class HashingImpl : public SimpleLayer {
 public:
  explicit HashingImpl(const HashingOptions& options);
  explicit HashingImpl(const Json& config);
  std::string class_name() const override { return "Hashing"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  std::vector<at::ScalarType> compute_output_dtype(const std::vector<at::ScalarType>& in) override;
  Json get_config() const override;

  // The bin of each string (int64, shaped `shape`, default (n,)), as call()
  // computes for integer inputs; output_mode must be "int".
  at::Tensor hash_strings(const std::vector<std::string>& values, const Shape& shape = {}) const;

 private:
  HashingImpl(const HashingOptions& options, const Json& base_config);
  static HashingOptions options_from_config(const Json& config);
  int64_t bin_of(const std::string& s) const;
  // The bins of strings (mask_value as a string honoured), shaped `shape` (default (n,)).
  at::Tensor hash_bins(const std::vector<std::string>& values, const Shape& shape) const;
  HashingOptions options_;  // checked: the layer's config (salt as a pair)
  std::optional<std::array<uint64_t, 2>> salt_;
};
KILN_LAYER_HOLDER(Hashing, HashingOptions);

class IntegerLookupImpl : public SimpleLayer {
 public:
  explicit IntegerLookupImpl(const IntegerLookupOptions& options);
  explicit IntegerLookupImpl(const Json& config = Json::object());
  std::string class_name() const override { return "IntegerLookup"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  std::vector<at::ScalarType> compute_output_dtype(const std::vector<at::ScalarType>& in) override;
  Json get_config() const override;

  // Replaces the vocabulary (see above); `data` is any integer tensor.
  void adapt(const at::Tensor& data);
  // Streaming form: calls next_batch() until it returns an undefined tensor.
  void adapt(const std::function<at::Tensor()>& next_batch);
  void set_vocabulary(const std::vector<int64_t>& vocabulary);
  // The learned or given tokens, without mask and OOV tokens.
  const std::vector<int64_t>& get_vocabulary() const { return options_.vocabulary; }
  // Ids in use: reserved (mask, OOV) plus vocabulary.
  int64_t vocabulary_size() const;

 private:
  IntegerLookupImpl(const IntegerLookupOptions& options, const Json& base_config);
  static IntegerLookupOptions options_from_config(const Json& config);
  int64_t oov_start() const;
  int64_t token_start() const;
  int64_t depth() const;
  IntegerLookupOptions options_;                // checked: the layer's config, vocabulary included
  std::unordered_map<int64_t, int64_t> index_;  // token -> position in options_.vocabulary
};
KILN_LAYER_HOLDER(IntegerLookup, IntegerLookupOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_CATEGORICAL_H
#include "kiln/layers/legacy_names.h"
