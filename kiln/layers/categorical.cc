#include "kiln/layers/categorical.h"

#include <algorithm>
#include <map>

#include "kiln/layers/config_reader.h"
#include "kiln/layers/string_hash.h"

namespace kiln {
namespace {

const std::vector<std::string> kCatModes = {"one_hot", "multi_hot", "count"};

// Integer ids as int64 (floats truncate toward zero, as Keras's cast).
at::Tensor cat_as_ids(const at::Tensor& x) { return x.scalar_type() == at::kLong ? x : x.to(at::kLong); }

std::string cat_first_values(const at::Tensor& bad) {
  std::string out;
  auto v = bad.reshape(-1);
  for (int64_t i = 0; i < std::min<int64_t>(v.numel(), 5); ++i)
    out += (out.empty() ? "" : ", ") + std::to_string(v[i].item<int64_t>());
  return out;
}

}  // namespace

// --- encoding ---------------------------------------------------------------------
Shape encoded_shape(const Shape& input, int64_t depth, const std::string& mode, const std::string& owner) {
  if (input.size() > 2 || input.empty())
    throw ShapeError(owner + ": output_mode=\"" + mode +
                     "\" takes inputs of rank 1 or 2 (batch, ids). Received shape " + shape_to_string(input));
  if (mode == "one_hot" && input.size() == 2 && input[1] != 1) return {input[0], input[1], depth};
  return {input[0], depth};
}

at::Tensor encode_categorical(const at::Tensor& ids_in, int64_t depth, const std::string& mode, at::ScalarType dtype,
                              const std::string& owner, const at::Tensor& drop) {
  encoded_shape(sizes_of(ids_in), depth, mode, owner);  // rank check
  at::Tensor ids = cat_as_ids(ids_in);
  at::Tensor keep = drop.defined() ? at::logical_not(drop) : at::ones_like(ids, ids.options().dtype(at::kBool));
  at::Tensor bad = at::logical_and(keep, at::logical_or(ids < 0, ids >= depth));
  if (bad.any().item<bool>())
    throw ValueError(owner + ": input ids must be in the range [0, " + std::to_string(depth) + "). Received " +
                     cat_first_values(ids.masked_select(bad)));
  // Dropped ids go to an extra column that is cut off.
  at::Tensor safe = at::where(keep, ids, at::full_like(ids, depth));
  if (mode == "one_hot" && ids.dim() == 2 && ids.size(1) == 1) safe = safe.squeeze(1);
  at::Tensor oh = at::one_hot(safe, depth + 1).slice(-1, 0, depth).to(dtype);
  if (mode == "one_hot") return oh;
  if (ids.dim() == 1) return oh;  // one id per sample
  at::Tensor counts = oh.sum(1);
  return mode == "count" ? counts : at::clamp_max(counts, 1.0);
}

// --- CategoryEncoding ----------------------------------------------------------------
CategoryEncoding::CategoryEncoding(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "CategoryEncoding");
  if (!r.has("num_tokens"))
    throw ValueError("CategoryEncoding: the config is missing `num_tokens` (the number of distinct ids)");
  num_tokens_ = r.positive_int("num_tokens");
  output_mode_ = r.choice("output_mode", "multi_hot", kCatModes);
  if (r.boolean("sparse", false)) r.invalid("sparse", "false (kiln has no sparse tensors)");
  r.finish();
}

CategoryEncoding::CategoryEncoding(int64_t num_tokens, const std::string& output_mode, const Json& extra)
    : CategoryEncoding(merged_config(extra, Json{{"num_tokens", num_tokens}, {"output_mode", output_mode}})) {}

at::Tensor CategoryEncoding::call1(const at::Tensor& x, bool training) {
  return encode_categorical(x, num_tokens_, output_mode_, dtype_policy().compute_dtype(),
                            "CategoryEncoding '" + name() + "'");
}

std::vector<Shape> CategoryEncoding::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return {encoded_shape(input_shapes.at(0), num_tokens_, output_mode_, "CategoryEncoding '" + name() + "'")};
}

Json CategoryEncoding::get_config() const {
  Json j = base_config();
  j["num_tokens"] = num_tokens_;
  j["output_mode"] = output_mode_;
  j["sparse"] = false;
  return j;
}

KILN_REGISTER_LAYER(CategoryEncoding);

// --- Hashing ------------------------------------------------------------------------
Hashing::Hashing(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "Hashing");
  if (!r.has("num_bins")) throw ValueError("Hashing: the config is missing `num_bins` (a positive integer)");
  num_bins_ = r.positive_int("num_bins");
  const Json* m = r.get("mask_value");
  if (m && !m->is_number_integer() && !m->is_string()) r.invalid("mask_value", "null, an integer or a string");
  mask_value_ = m ? *m : Json(nullptr);
  const Json* s = r.get("salt");
  if (s) {
    auto as_u64 = [&](const Json& e) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0) r.invalid("salt", "null, a non-negative int or a list of 2");
      return (uint64_t)e.get<int64_t>();
    };
    if (s->is_array() && s->size() == 2)
      salt_ = std::array<uint64_t, 2>{as_u64((*s)[0]), as_u64((*s)[1])};
    else if (s->is_number_integer())
      salt_ = std::array<uint64_t, 2>{as_u64(*s), as_u64(*s)};
    else
      r.invalid("salt", "null, a non-negative int or a list of 2");
    salt_json_ = Json::array({(int64_t)(*salt_)[0], (int64_t)(*salt_)[1]});
  } else {
    salt_json_ = nullptr;
  }
  output_mode_ = r.choice("output_mode", "int", {"int", "one_hot", "multi_hot", "count"});
  if (r.boolean("sparse", false)) r.invalid("sparse", "false (kiln has no sparse tensors)");
  r.finish();
}

int64_t Hashing::bin_of(const std::string& s) const {
  const bool masked = !mask_value_.is_null() && num_bins_ > 1;
  const uint64_t bins = (uint64_t)(masked ? num_bins_ - 1 : num_bins_);
  const uint64_t h = salt_ ? siphash24((*salt_)[0], (*salt_)[1], s) : fingerprint64(s);
  return (int64_t)(h % bins) + (masked ? 1 : 0);
}

at::Tensor Hashing::call1(const at::Tensor& x, bool training) {
  at::Tensor ids = cat_as_ids(x).contiguous();
  at::Tensor out = at::empty_like(ids);
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  const bool int_mask = mask_value_.is_number_integer() && num_bins_ > 1;
  const int64_t mask = int_mask ? mask_value_.get<int64_t>() : 0;
  for (int64_t i = 0; i < ids.numel(); ++i) o[i] = int_mask && in[i] == mask ? 0 : bin_of(std::to_string(in[i]));
  if (output_mode_ == "int") return out;
  return encode_categorical(out, num_bins_, output_mode_, dtype_policy().compute_dtype(), "Hashing '" + name() + "'");
}

at::Tensor Hashing::hash_strings(const std::vector<std::string>& values, const Shape& shape) const {
  if (output_mode_ != "int")
    throw ValueError("Hashing '" + name() +
                     "': hash_strings() needs output_mode=\"int\"; encode its ids with "
                     "CategoryEncoding");
  const bool str_mask = mask_value_.is_string() && num_bins_ > 1;
  std::vector<int64_t> bins;
  bins.reserve(values.size());
  for (auto& v : values) bins.push_back(str_mask && v == mask_value_.get<std::string>() ? 0 : bin_of(v));
  at::Tensor t = at::tensor(bins, at::kLong);
  if (shape.empty()) return t;
  if (num_elements(shape) != (int64_t)values.size())
    throw ShapeError("Hashing '" + name() + "': " + std::to_string(values.size()) + " strings do not fill shape " +
                     shape_to_string(shape));
  return t.reshape(shape);
}

std::vector<Shape> Hashing::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  if (output_mode_ == "int") return input_shapes;
  return {encoded_shape(input_shapes.at(0), num_bins_, output_mode_, "Hashing '" + name() + "'")};
}

std::vector<at::ScalarType> Hashing::compute_output_dtype(const std::vector<at::ScalarType>& in) {
  if (output_mode_ == "int") return {at::kLong};
  return {};
}

Json Hashing::get_config() const {
  Json j = base_config();
  j["num_bins"] = num_bins_;
  j["mask_value"] = mask_value_;
  j["salt"] = salt_json_;
  j["output_mode"] = output_mode_;
  j["sparse"] = false;
  return j;
}

KILN_REGISTER_LAYER(Hashing);

// --- IntegerLookup ------------------------------------------------------------------
IntegerLookup::IntegerLookup(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "IntegerLookup");
  if (r.has("max_tokens")) {
    max_tokens_ = r.positive_int("max_tokens");
    if (*max_tokens_ < 2) r.invalid("max_tokens", "null or an integer greater than 1");
  } else {
    r.get("max_tokens");
  }
  num_oov_ = r.integer("num_oov_indices", 1);
  if (num_oov_ < 0) r.invalid("num_oov_indices", "a non-negative integer");
  if (const Json* m = r.get("mask_token")) {
    if (!m->is_number_integer()) r.invalid("mask_token", "null or an integer");
    mask_token_ = m->get<int64_t>();
  }
  oov_token_ = r.integer("oov_token", -1);
  const std::string vdt = r.choice("vocabulary_dtype", "int64", {"int64", "int32"});
  (void)vdt;
  if (r.get("idf_weights")) r.invalid("idf_weights", "null (kiln has no \"tf_idf\" output mode yet)");
  invert_ = r.boolean("invert", false);
  output_mode_ = r.choice("output_mode", "int", {"int", "one_hot", "multi_hot", "count"});
  if (r.boolean("sparse", false)) r.invalid("sparse", "false (kiln has no sparse tensors)");
  pad_to_max_tokens_ = r.boolean("pad_to_max_tokens", false);
  if (invert_ && output_mode_ != "int") r.invalid("invert", "false unless output_mode is \"int\"");
  if (pad_to_max_tokens_ && !max_tokens_) r.invalid("pad_to_max_tokens", "false unless max_tokens is set");
  std::vector<int64_t> vocab;
  if (const Json* v = r.get("vocabulary")) {
    if (!v->is_array()) r.invalid("vocabulary", "null or a list of integers (vocabulary files are not supported)");
    for (auto& e : *v) {
      if (!e.is_number_integer()) r.invalid("vocabulary", "a list of integers");
      vocab.push_back(e.get<int64_t>());
    }
  }
  r.finish();
  set_vocabulary(vocab);
}

int64_t IntegerLookup::oov_start() const { return mask_token_ && output_mode_ == "int" ? 1 : 0; }
int64_t IntegerLookup::token_start() const { return oov_start() + num_oov_; }
int64_t IntegerLookup::vocabulary_size() const { return token_start() + (int64_t)vocabulary_.size(); }
int64_t IntegerLookup::depth() const {
  return pad_to_max_tokens_ ? std::max(*max_tokens_, vocabulary_size()) : vocabulary_size();
}

void IntegerLookup::set_vocabulary(const std::vector<int64_t>& vocabulary) {
  std::unordered_map<int64_t, int64_t> index;
  for (size_t i = 0; i < vocabulary.size(); ++i) {
    const int64_t t = vocabulary[i];
    if ((mask_token_ && t == *mask_token_) || t == oov_token_)
      throw ValueError("IntegerLookup '" + name() +
                       "': the vocabulary must not contain the mask token or the OOV "
                       "token (they have reserved ids). Received " +
                       std::to_string(t) + " at position " + std::to_string(i));
    if (!index.emplace(t, (int64_t)i).second)
      throw ValueError("IntegerLookup '" + name() + "': the vocabulary has repeated token " + std::to_string(t));
  }
  if (max_tokens_ && token_start() + (int64_t)vocabulary.size() > *max_tokens_)
    throw ValueError("IntegerLookup '" + name() + "': a vocabulary of " + std::to_string(vocabulary.size()) +
                     " tokens plus " + std::to_string(token_start()) +
                     " reserved ids exceeds max_tokens=" + std::to_string(*max_tokens_));
  vocabulary_ = vocabulary;
  index_ = std::move(index);
}

void IntegerLookup::adapt(const at::Tensor& data) {
  bool given = false;
  adapt([&]() -> at::Tensor {
    if (given) return at::Tensor();
    given = true;
    return data;
  });
}

void IntegerLookup::adapt(const std::function<at::Tensor()>& next_batch) {
  std::map<int64_t, int64_t> counts;
  while (true) {
    at::Tensor batch = next_batch();
    if (!batch.defined()) break;
    at::Tensor ids = cat_as_ids(batch).contiguous().reshape(-1);
    const int64_t* p = ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) ++counts[p[i]];
  }
  if (mask_token_) counts.erase(*mask_token_);
  counts.erase(oov_token_);
  std::vector<std::pair<int64_t, int64_t>> order(counts.begin(), counts.end());
  // Keras: np.lexsort((tokens, counts))[::-1] -> count descending, then token descending.
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first > b.first;
  });
  if (max_tokens_) {
    const int64_t room = std::max<int64_t>(*max_tokens_ - token_start(), 0);
    if ((int64_t)order.size() > room) order.resize(room);
  }
  std::vector<int64_t> vocab;
  for (auto& [token, n] : order) vocab.push_back(token);
  set_vocabulary(vocab);
}

at::Tensor IntegerLookup::call1(const at::Tensor& x, bool training) {
  at::Tensor ids = cat_as_ids(x).contiguous();
  at::Tensor out = at::empty_like(ids);
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  const int64_t n = ids.numel();
  if (invert_) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = in[i] - token_start();
      if (mask_token_ && in[i] == 0)
        o[i] = *mask_token_;
      else
        o[i] = k >= 0 && k < (int64_t)vocabulary_.size() ? vocabulary_[k] : oov_token_;
    }
    return out;
  }
  at::Tensor drop;
  bool* dp = nullptr;
  if (mask_token_ && output_mode_ != "int") {
    drop = at::zeros(ids.sizes(), ids.options().dtype(at::kBool));
    dp = drop.data_ptr<bool>();
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = in[i];
    if (mask_token_ && t == *mask_token_) {
      o[i] = 0;
      if (dp) dp[i] = true;
      continue;
    }
    auto it = index_.find(t);
    if (it != index_.end()) {
      o[i] = token_start() + it->second;
    } else if (num_oov_ == 0) {
      throw ValueError("IntegerLookup '" + name() + "': input " + std::to_string(t) +
                       " is not in the vocabulary and num_oov_indices=0; set num_oov_indices >= 1 to map "
                       "unknown values to an OOV id");
    } else {
      o[i] = oov_start() + ((t % num_oov_) + num_oov_) % num_oov_;  // floormod
    }
  }
  if (output_mode_ == "int") return out;
  return encode_categorical(out, depth(), output_mode_, dtype_policy().compute_dtype(),
                            "IntegerLookup '" + name() + "'", drop);
}

std::vector<Shape> IntegerLookup::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  if (output_mode_ == "int") return input_shapes;
  return {encoded_shape(input_shapes.at(0), depth(), output_mode_, "IntegerLookup '" + name() + "'")};
}

std::vector<at::ScalarType> IntegerLookup::compute_output_dtype(const std::vector<at::ScalarType>& in) {
  if (output_mode_ == "int") return {at::kLong};
  return {};
}

Json IntegerLookup::get_config() const {
  Json j = base_config();
  j["max_tokens"] = max_tokens_ ? Json(*max_tokens_) : Json(nullptr);
  j["num_oov_indices"] = num_oov_;
  j["mask_token"] = mask_token_ ? Json(*mask_token_) : Json(nullptr);
  j["oov_token"] = oov_token_;
  j["vocabulary"] = vocabulary_.empty() ? Json(nullptr) : Json(vocabulary_);
  j["vocabulary_dtype"] = "int64";
  j["idf_weights"] = nullptr;
  j["invert"] = invert_;
  j["output_mode"] = output_mode_;
  j["sparse"] = false;
  j["pad_to_max_tokens"] = pad_to_max_tokens_;
  return j;
}

KILN_REGISTER_LAYER(IntegerLookup);

}  // namespace kiln
