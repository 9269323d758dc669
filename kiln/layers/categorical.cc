#include "kiln/layers/categorical.h"

#include <algorithm>
#include <map>

#include "kiln/core/string_tensor.h"
#include "kiln/layers/config_fields.h"
#include "kiln/layers/string_hash.h"

namespace kiln {
namespace {

const std::vector<std::string> kCatModes = {"one_hot", "multi_hot", "count"};
const std::vector<std::string> kCatIntModes = {"int", "one_hot", "multi_hot", "count"};

// Keras's `sparse`, which kiln accepts only as false.
template <class O>
FieldDef<O> cat_sparse_field() {
  return field("sparse", &O::sparse).where([](bool sparse) { return !sparse; }, "false (kiln has no sparse tensors)");
}

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

std::vector<std::string> string_input(const at::Tensor& x, const std::string& owner) {
  if (x.scalar_type() != string_storage_dtype)
    throw ValueError(owner +
                     " takes a string tensor (uint8 rows from strings::encode, as an Input of dtype \"string\" "
                     "gives). Received a " +
                     dtype_to_string(x.scalar_type()) + " tensor of shape " + shape_to_string(sizes_of(x)));
  return strings::decode(x.to(at::kCPU), owner + " input");
}

// --- CategoryEncoding ----------------------------------------------------------------
namespace {
const FieldTable<layers::CategoryEncodingOptions>& category_encoding_fields() {
  using O = layers::CategoryEncodingOptions;
  static const FieldTable<O> t = {field("num_tokens", &O::num_tokens).positive().required("the number of distinct ids"),
                                  field("output_mode", &O::output_mode).choice(kCatModes), cat_sparse_field<O>()};
  return t;
}
}  // namespace

layers::CategoryEncodingOptions layers::CategoryEncodingImpl::options_from_config(const Json& config) {
  return read_fields(config, "CategoryEncoding", category_encoding_fields());
}

layers::CategoryEncodingImpl::CategoryEncodingImpl(const layers::CategoryEncodingOptions& o)
    : layers::CategoryEncodingImpl(o, layer_base_config(o.base)) {}

layers::CategoryEncodingImpl::CategoryEncodingImpl(const Json& config)
    : layers::CategoryEncodingImpl(options_from_config(config), config) {}

layers::CategoryEncodingImpl::CategoryEncodingImpl(const layers::CategoryEncodingOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("CategoryEncoding", options_, category_encoding_fields());
}

layers::CategoryEncodingImpl::CategoryEncodingImpl(int64_t num_tokens, const std::string& output_mode,
                                                   const Json& extra)
    : layers::CategoryEncodingImpl(
          merged_config(extra, Json{{"num_tokens", num_tokens}, {"output_mode", output_mode}})) {}

at::Tensor layers::CategoryEncodingImpl::call1(const at::Tensor& x, bool training) {
  return encode_categorical(x, options_.num_tokens, options_.output_mode, dtype_policy().compute_dtype(),
                            "CategoryEncoding '" + name() + "'");
}

std::vector<Shape> layers::CategoryEncodingImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return {encoded_shape(input_shapes.at(0), options_.num_tokens, options_.output_mode,
                        "CategoryEncoding '" + name() + "'")};
}

Json layers::CategoryEncodingImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, category_encoding_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(CategoryEncoding, layers::CategoryEncodingImpl);

// --- Hashing ------------------------------------------------------------------------
namespace {
// Keras's salt: k means (k, k); std::nullopt for null.
std::optional<std::array<uint64_t, 2>> hashing_salt(const Json& salt) {
  auto u64 = [](const Json& e) { return e.is_number_integer() && e.get<int64_t>() >= 0; };
  if (salt.is_number_integer() && u64(salt)) return std::array<uint64_t, 2>{salt.get<uint64_t>(), salt.get<uint64_t>()};
  if (salt.is_array() && salt.size() == 2 && u64(salt[0]) && u64(salt[1]))
    return std::array<uint64_t, 2>{salt[0].get<uint64_t>(), salt[1].get<uint64_t>()};
  return std::nullopt;
}

const FieldTable<layers::HashingOptions>& hashing_fields() {
  using O = layers::HashingOptions;
  static const FieldTable<O> t = {
      field("num_bins", &O::num_bins).positive().required(),
      field("mask_value", &O::mask_value)
          .where([](const Json& m) { return m.is_number_integer() || m.is_string(); }, "null, an integer or a string"),
      field("salt", &O::salt)
          .where([](const Json& s) { return hashing_salt(s).has_value(); }, "null, a non-negative int or a list of 2"),
      field("output_mode", &O::output_mode).choice(kCatIntModes), cat_sparse_field<O>()};
  return t;
}
}  // namespace

layers::HashingOptions layers::HashingImpl::options_from_config(const Json& config) {
  return read_fields(config, "Hashing", hashing_fields());
}

layers::HashingImpl::HashingImpl(const layers::HashingOptions& o) : layers::HashingImpl(o, layer_base_config(o.base)) {}

layers::HashingImpl::HashingImpl(const Json& config) : layers::HashingImpl(options_from_config(config), config) {}

layers::HashingImpl::HashingImpl(const layers::HashingOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Hashing", options_, hashing_fields());
  salt_ = hashing_salt(options_.salt);
  if (salt_) options_.salt = Json::array({(int64_t)(*salt_)[0], (int64_t)(*salt_)[1]});  // written as the pair
}

int64_t layers::HashingImpl::bin_of(const std::string& s) const {
  const bool masked = !options_.mask_value.is_null() && options_.num_bins > 1;
  const uint64_t bins = (uint64_t)(masked ? options_.num_bins - 1 : options_.num_bins);
  const uint64_t h = salt_ ? siphash24((*salt_)[0], (*salt_)[1], s) : fingerprint64(s);
  return (int64_t)(h % bins) + (masked ? 1 : 0);
}

at::Tensor layers::HashingImpl::call1(const at::Tensor& x, bool training) {
  if (x.scalar_type() == string_storage_dtype) {
    const std::string owner = "Hashing '" + name() + "'";
    at::Tensor bins = hash_bins(string_input(x, owner), strings::logical_shape(x)).to(x.device());
    if (options_.output_mode == "int") return bins;
    return encode_categorical(bins, options_.num_bins, options_.output_mode, dtype_policy().compute_dtype(), owner);
  }
  at::Tensor ids = cat_as_ids(x).contiguous();
  at::Tensor out = at::empty_like(ids);
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  const bool int_mask = options_.mask_value.is_number_integer() && options_.num_bins > 1;
  const int64_t mask = int_mask ? options_.mask_value.get<int64_t>() : 0;
  for (int64_t i = 0; i < ids.numel(); ++i) o[i] = int_mask && in[i] == mask ? 0 : bin_of(std::to_string(in[i]));
  if (options_.output_mode == "int") return out;
  return encode_categorical(out, options_.num_bins, options_.output_mode, dtype_policy().compute_dtype(),
                            "Hashing '" + name() + "'");
}

at::Tensor layers::HashingImpl::hash_strings(const std::vector<std::string>& values, const Shape& shape) const {
  if (options_.output_mode != "int")
    throw ValueError("Hashing '" + name() +
                     "': hash_strings() needs output_mode=\"int\"; encode its ids with "
                     "CategoryEncoding");
  return hash_bins(values, shape);
}

at::Tensor layers::HashingImpl::hash_bins(const std::vector<std::string>& values, const Shape& shape) const {
  const bool str_mask = options_.mask_value.is_string() && options_.num_bins > 1;
  std::vector<int64_t> bins;
  bins.reserve(values.size());
  for (auto& v : values) bins.push_back(str_mask && v == options_.mask_value.get<std::string>() ? 0 : bin_of(v));
  at::Tensor t = at::tensor(bins, at::kLong);
  if (shape.empty()) return t;
  if (num_elements(shape) != (int64_t)values.size())
    throw ShapeError("Hashing '" + name() + "': " + std::to_string(values.size()) + " strings do not fill shape " +
                     shape_to_string(shape));
  return t.reshape(shape);
}

std::vector<Shape> layers::HashingImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  if (options_.output_mode == "int") return input_shapes;
  return {encoded_shape(input_shapes.at(0), options_.num_bins, options_.output_mode, "Hashing '" + name() + "'")};
}

std::vector<at::ScalarType> layers::HashingImpl::compute_output_dtype(const std::vector<at::ScalarType>& in) {
  if (options_.output_mode == "int") return {at::kLong};
  return {};
}

Json layers::HashingImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, hashing_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Hashing, layers::HashingImpl);

// --- IntegerLookup ------------------------------------------------------------------
namespace {
const FieldTable<layers::IntegerLookupOptions>& integer_lookup_fields() {
  using O = layers::IntegerLookupOptions;
  const char* const max_tokens = "max_tokens";
  const char* const max_tokens_expected = "null or an integer greater than 1";
  const char* const vocabulary = "vocabulary";
  static const FieldTable<O> t = {
      FieldDef<O>{max_tokens,
                  [=](ConfigReader& r, O& o) {
                    if (!r.has(max_tokens)) {
                      r.get(max_tokens);  // marks it read
                      return;
                    }
                    o.max_tokens = r.positive_int(max_tokens);
                    if (*o.max_tokens < 2) r.invalid(max_tokens, max_tokens_expected);
                  },
                  [=](const std::string& owner, O& o) {
                    if (o.max_tokens && option_check::positive(owner, max_tokens, *o.max_tokens) < 2)
                      option_check::invalid(owner, max_tokens, max_tokens_expected, *o.max_tokens);
                  },
                  [=](Json& j, const O& o) { j[max_tokens] = o.max_tokens ? Json(*o.max_tokens) : Json(nullptr); }},
      field("num_oov_indices", &O::num_oov_indices).where([](int64_t n) { return n >= 0; }, "a non-negative integer"),
      field("mask_token", &O::mask_token), field("oov_token", &O::oov_token),
      FieldDef<O>{
          vocabulary,
          [=](ConfigReader& r, O& o) {
            const Json* v = r.get(vocabulary);
            if (!v) return;
            if (!v->is_array())
              r.invalid(vocabulary, "null or a list of integers (vocabulary files are not supported)");
            for (auto& e : *v) {
              if (!e.is_number_integer()) r.invalid(vocabulary, "a list of integers");
              o.vocabulary.push_back(e.get<int64_t>());
            }
          },
          nullptr,  // set_vocabulary() checks the tokens
          [=](Json& j, const O& o) { j[vocabulary] = o.vocabulary.empty() ? Json(nullptr) : Json(o.vocabulary); }},
      // Tokens are int64 whatever the config asks for.
      FieldDef<O>{"vocabulary_dtype",
                  [](ConfigReader& r, O&) {
                    r.choice("vocabulary_dtype", "int64", {"int64", "int32"});
                  },
                  nullptr, [](Json& j, const O&) { j["vocabulary_dtype"] = "int64"; }},
      FieldDef<O>{"idf_weights",
                  [](ConfigReader& r, O&) {
                    if (r.get("idf_weights")) r.invalid("idf_weights", "null (kiln has no \"tf_idf\" output mode yet)");
                  },
                  nullptr, [](Json& j, const O&) { j["idf_weights"] = nullptr; }},
      field("invert", &O::invert), field("output_mode", &O::output_mode).choice(kCatIntModes), cat_sparse_field<O>(),
      field("pad_to_max_tokens", &O::pad_to_max_tokens)};
  return t;
}
}  // namespace

layers::IntegerLookupOptions layers::IntegerLookupImpl::options_from_config(const Json& config) {
  return read_fields(config, "IntegerLookup", integer_lookup_fields());
}

layers::IntegerLookupImpl::IntegerLookupImpl(const layers::IntegerLookupOptions& o)
    : layers::IntegerLookupImpl(o, layer_base_config(o.base)) {}

layers::IntegerLookupImpl::IntegerLookupImpl(const Json& config)
    : layers::IntegerLookupImpl(options_from_config(config), config) {}

layers::IntegerLookupImpl::IntegerLookupImpl(const layers::IntegerLookupOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("IntegerLookup", options_, integer_lookup_fields());
  if (options_.invert && options_.output_mode != "int")
    option_check::invalid("IntegerLookup", "invert", "false unless output_mode is \"int\"", true);
  if (options_.pad_to_max_tokens && !options_.max_tokens)
    option_check::invalid("IntegerLookup", "pad_to_max_tokens", "false unless max_tokens is set", true);
  set_vocabulary(options_.vocabulary);
}

int64_t layers::IntegerLookupImpl::oov_start() const {
  return options_.mask_token && options_.output_mode == "int" ? 1 : 0;
}
int64_t layers::IntegerLookupImpl::token_start() const { return oov_start() + options_.num_oov_indices; }
int64_t layers::IntegerLookupImpl::vocabulary_size() const {
  return token_start() + (int64_t)options_.vocabulary.size();
}
int64_t layers::IntegerLookupImpl::depth() const {
  return options_.pad_to_max_tokens ? std::max(*options_.max_tokens, vocabulary_size()) : vocabulary_size();
}

void layers::IntegerLookupImpl::set_vocabulary(const std::vector<int64_t>& vocabulary) {
  std::unordered_map<int64_t, int64_t> index;
  for (size_t i = 0; i < vocabulary.size(); ++i) {
    const int64_t t = vocabulary[i];
    if ((options_.mask_token && t == *options_.mask_token) || t == options_.oov_token)
      throw ValueError("IntegerLookup '" + name() +
                       "': the vocabulary must not contain the mask token or the OOV "
                       "token (they have reserved ids). Received " +
                       std::to_string(t) + " at position " + std::to_string(i));
    if (!index.emplace(t, (int64_t)i).second)
      throw ValueError("IntegerLookup '" + name() + "': the vocabulary has repeated token " + std::to_string(t));
  }
  if (options_.max_tokens && token_start() + (int64_t)vocabulary.size() > *options_.max_tokens)
    throw ValueError("IntegerLookup '" + name() + "': a vocabulary of " + std::to_string(vocabulary.size()) +
                     " tokens plus " + std::to_string(token_start()) +
                     " reserved ids exceeds max_tokens=" + std::to_string(*options_.max_tokens));
  options_.vocabulary = vocabulary;
  index_ = std::move(index);
}

void layers::IntegerLookupImpl::adapt(const at::Tensor& data) {
  bool given = false;
  adapt([&]() -> at::Tensor {
    if (given) return at::Tensor();
    given = true;
    return data;
  });
}

void layers::IntegerLookupImpl::adapt(const std::function<at::Tensor()>& next_batch) {
  std::map<int64_t, int64_t> counts;
  while (true) {
    at::Tensor batch = next_batch();
    if (!batch.defined()) break;
    at::Tensor ids = cat_as_ids(batch).contiguous().reshape(-1);
    const int64_t* p = ids.data_ptr<int64_t>();
    for (int64_t i = 0; i < ids.numel(); ++i) ++counts[p[i]];
  }
  if (options_.mask_token) counts.erase(*options_.mask_token);
  counts.erase(options_.oov_token);
  std::vector<std::pair<int64_t, int64_t>> order(counts.begin(), counts.end());
  // Keras: np.lexsort((tokens, counts))[::-1] -> count descending, then token descending.
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first > b.first;
  });
  if (options_.max_tokens) {
    const int64_t room = std::max<int64_t>(*options_.max_tokens - token_start(), 0);
    if ((int64_t)order.size() > room) order.resize(room);
  }
  std::vector<int64_t> vocab;
  for (auto& [token, n] : order) vocab.push_back(token);
  set_vocabulary(vocab);
}

at::Tensor layers::IntegerLookupImpl::call1(const at::Tensor& x, bool training) {
  at::Tensor ids = cat_as_ids(x).contiguous();
  at::Tensor out = at::empty_like(ids);
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  const int64_t n = ids.numel();
  if (options_.invert) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = in[i] - token_start();
      if (options_.mask_token && in[i] == 0)
        o[i] = *options_.mask_token;
      else
        o[i] = k >= 0 && k < (int64_t)options_.vocabulary.size() ? options_.vocabulary[k] : options_.oov_token;
    }
    return out;
  }
  at::Tensor drop;
  bool* dp = nullptr;
  if (options_.mask_token && options_.output_mode != "int") {
    drop = at::zeros(ids.sizes(), ids.options().dtype(at::kBool));
    dp = drop.data_ptr<bool>();
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = in[i];
    if (options_.mask_token && t == *options_.mask_token) {
      o[i] = 0;
      if (dp) dp[i] = true;
      continue;
    }
    auto it = index_.find(t);
    if (it != index_.end()) {
      o[i] = token_start() + it->second;
    } else if (options_.num_oov_indices == 0) {
      throw ValueError("IntegerLookup '" + name() + "': input " + std::to_string(t) +
                       " is not in the vocabulary and num_oov_indices=0; set num_oov_indices >= 1 to map "
                       "unknown values to an OOV id");
    } else {
      const int64_t n_oov = options_.num_oov_indices;
      o[i] = oov_start() + ((t % n_oov) + n_oov) % n_oov;  // floormod
    }
  }
  if (options_.output_mode == "int") return out;
  return encode_categorical(out, depth(), options_.output_mode, dtype_policy().compute_dtype(),
                            "IntegerLookup '" + name() + "'", drop);
}

std::vector<Shape> layers::IntegerLookupImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  if (options_.output_mode == "int") return input_shapes;
  return {encoded_shape(input_shapes.at(0), depth(), options_.output_mode, "IntegerLookup '" + name() + "'")};
}

std::vector<at::ScalarType> layers::IntegerLookupImpl::compute_output_dtype(const std::vector<at::ScalarType>& in) {
  if (options_.output_mode == "int") return {at::kLong};
  return {};
}

Json layers::IntegerLookupImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, integer_lookup_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(IntegerLookup, layers::IntegerLookupImpl);

}  // namespace kiln
