// Dataset's methods (argument checks, then a node) and the source nodes:
// from_tensors, from_tensor_slices, from_generator.
#include "kiln/data/dataset.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

#include <sstream>
#include <utility>

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/core/random.h"
#include "kiln/data/dataset_node.h"

namespace kiln {

// ---------------------------------------------------------------- helpers

int64_t data::DatasetIterator::skip_batches(int64_t n) {
  int64_t done = 0;
  while (done < n && next()) ++done;
  return done;
}

int64_t IndexStream::next_block(std::vector<int64_t>* out, int64_t max) {
  int64_t n = 0;
  while (n < max) {
    auto i = next();
    if (!i) break;
    out->push_back(*i);
    ++n;
  }
  return n;
}

int64_t IndexStream::skip(int64_t n) {
  int64_t done = 0;
  while (done < n && next()) ++done;
  return done;
}

std::string shape_string(const at::Tensor& t) {
  std::ostringstream s;
  s << "[";
  for (int64_t d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
  s << "]";
  return s.str();
}

void check_same_structure(const Element& first, const Element& other, int64_t index_in_batch) {
  if (first.size() != other.size()) {
    throw ShapeError("Dataset.batch: elements have different numbers of tensors: element 0 of the batch has " +
                     std::to_string(first.size()) + ", element " + std::to_string(index_in_batch) + " has " +
                     std::to_string(other.size()));
  }
  for (size_t j = 0; j < first.size(); ++j) {
    const at::Tensor& a = first[j];
    const at::Tensor& b = other[j];
    if (a.sizes() != b.sizes()) {
      // String tensors (kiln/core/string_tensor.h) of one logical shape differ in their row width only.
      const bool strings_of_two_widths = a.scalar_type() == at::kByte && b.scalar_type() == at::kByte && a.dim() >= 1 &&
                                         a.dim() == b.dim() &&
                                         a.sizes().slice(0, a.dim() - 1) == b.sizes().slice(0, b.dim() - 1);
      throw ShapeError("Dataset.batch: cannot stack elements of different shapes: component " + std::to_string(j) +
                       " has shape " + shape_string(a) + " in element 0 of the batch and " + shape_string(b) +
                       " in element " + std::to_string(index_in_batch) +
                       ". Pad or resize them in a map() before batch(), or use batch_size=1." +
                       (strings_of_two_widths ? " (String tensors of different widths: strings::pad_to_width them "
                                                "to one width in the map(), or encode all the strings together.)"
                                              : ""));
    }
    if (a.scalar_type() != b.scalar_type()) {
      throw ShapeError("Dataset.batch: cannot stack elements of different dtypes: component " + std::to_string(j) +
                       " is " + std::string(c10::toString(a.scalar_type())) + " in element 0 of the batch and " +
                       std::string(c10::toString(b.scalar_type())) + " in element " + std::to_string(index_in_batch));
    }
  }
}

void use_one_intra_op_thread_here() {
  // OpenMP's thread count is per thread. Let ATen initialise this thread's
  // first (it would later reset it to the global count), then lower it.
  // Looked up at run time: LibTorch builds without OpenMP have no such call.
  using SetFn = void (*)(int);
  static const auto set_omp_threads = reinterpret_cast<SetFn>(::dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  (void)at::get_num_threads();
  if (set_omp_threads) set_omp_threads(1);
}

namespace {

class RowIterator : public data::DatasetIterator {
 public:
  RowIterator(NodePtr owner, const Element* source, std::unique_ptr<IndexStream> stream)
      : owner_(std::move(owner)), source_(source), stream_(std::move(stream)) {}
  std::optional<Element> next() override {
    auto i = stream_->next();
    if (!i) return std::nullopt;
    Element e;
    e.reserve(source_->size());
    for (const auto& t : *source_) e.push_back(t.select(0, *i));
    return e;
  }
  int64_t skip_batches(int64_t n) override { return stream_->skip(n); }

 private:
  NodePtr owner_;          // keeps *source_ alive
  const Element* source_;  // owned by owner_
  std::unique_ptr<IndexStream> stream_;
};

// ------------------------------------------------------------ from_tensors

class TensorsNode : public DatasetNode {
 public:
  explicit TensorsNode(Element e) : element_(std::move(e)) {}
  std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t) const override {
    class It : public data::DatasetIterator {
     public:
      explicit It(std::shared_ptr<const TensorsNode> n) : node_(std::move(n)) {}
      std::optional<Element> next() override {
        if (done_) return std::nullopt;
        done_ = true;
        return node_->element_;
      }

     private:
      std::shared_ptr<const TensorsNode> node_;
      bool done_ = false;
    };
    return std::make_unique<It>(self<TensorsNode>());
  }
  int64_t cardinality() const override { return 1; }
  bool in_memory() const override { return true; }

 private:
  Element element_;
};

// ------------------------------------------------------ from_tensor_slices

class RangeStream : public IndexStream {
 public:
  explicit RangeStream(int64_t n) : n_(n) {}
  std::optional<int64_t> next() override {
    if (i_ >= n_) return std::nullopt;
    return i_++;
  }
  int64_t next_block(std::vector<int64_t>* out, int64_t max) override {
    int64_t k = std::min(max, n_ - i_);
    for (int64_t j = 0; j < k; ++j) out->push_back(i_ + j);
    i_ += k;
    return k;
  }
  int64_t skip(int64_t n) override {
    int64_t k = std::min(n, n_ - i_);
    i_ += k;
    return k;
  }

 private:
  int64_t n_;
  int64_t i_ = 0;
};

class SlicesNode : public DatasetNode {
 public:
  explicit SlicesNode(Element tensors) : tensors_(std::move(tensors)), n_(tensors_[0].size(0)) {}
  std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t key) const override {
    return make_row_iterator(shared_from_this(), &tensors_, index_stream(key));
  }
  int64_t cardinality() const override { return n_; }
  bool in_memory() const override { return true; }
  const Element* row_source() const override { return &tensors_; }
  std::unique_ptr<IndexStream> index_stream(uint64_t) const override { return std::make_unique<RangeStream>(n_); }

 private:
  Element tensors_;
  int64_t n_;
};

// ---------------------------------------------------------- from_generator

class GeneratorNode : public DatasetNode {
 public:
  using Make = std::function<std::function<std::optional<Element>()>()>;
  GeneratorNode(Make make, int64_t cardinality) : make_(std::move(make)), cardinality_(cardinality) {}
  std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t) const override {
    class It : public data::DatasetIterator {
     public:
      explicit It(std::function<std::optional<Element>()> gen) : gen_(std::move(gen)) {}
      std::optional<Element> next() override {
        if (done_) return std::nullopt;
        auto e = gen_();
        if (!e) done_ = true;
        return e;
      }

     private:
      std::function<std::optional<Element>()> gen_;
      bool done_ = false;
    };
    auto gen = make_();
    if (!gen) throw ValueError("Dataset.from_generator: the factory returned an empty generator function");
    return std::make_unique<It>(std::move(gen));
  }
  int64_t cardinality() const override { return cardinality_; }

 private:
  Make make_;
  int64_t cardinality_;
};

void require_positive(const char* op, const char* name, int64_t v) {
  if (v <= 0) {
    throw ValueError(std::string("Dataset.") + op + ": received an invalid value for `" + name +
                     "`, expected a positive integer. Received: " + name + "=" + std::to_string(v));
  }
}

}  // namespace

std::unique_ptr<data::DatasetIterator> make_row_iterator(NodePtr owner, const Element* source,
                                                         std::unique_ptr<IndexStream> stream) {
  return std::make_unique<RowIterator>(std::move(owner), source, std::move(stream));
}

// ------------------------------------------------------------ Dataset API

data::Dataset data::Dataset::from_tensors(const Element& tensors) {
  if (tensors.empty()) throw ValueError("Dataset.from_tensors: received no tensors, expected at least one");
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) {
      throw ValueError("Dataset.from_tensors: tensor " + std::to_string(i) + " is undefined");
    }
  }
  return data::Dataset(std::make_shared<TensorsNode>(tensors));
}

data::Dataset data::Dataset::from_tensor_slices(const Element& tensors) {
  if (tensors.empty()) throw ValueError("Dataset.from_tensor_slices: received no tensors, expected at least one");
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) {
      throw ValueError("Dataset.from_tensor_slices: tensor " + std::to_string(i) + " is undefined");
    }
    if (tensors[i].dim() == 0) {
      throw ValueError("Dataset.from_tensor_slices: tensor " + std::to_string(i) +
                       " is a scalar; slicing needs at least one dimension (use from_tensors)");
    }
  }
  const int64_t n = tensors[0].size(0);
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].size(0) != n) {
      std::string lengths;
      for (size_t j = 0; j < tensors.size(); ++j) lengths += (j ? ", " : "") + std::to_string(tensors[j].size(0));
      throw ValueError(
          "Dataset.from_tensor_slices: all tensors must have the same length along dim 0. Received lengths: "
          "[" +
          lengths + "] (tensor shapes: " + shape_string(tensors[0]) + " and " + shape_string(tensors[i]) + ")");
    }
  }
  return data::Dataset(std::make_shared<SlicesNode>(tensors));
}

data::Dataset data::Dataset::from_generator(std::function<std::function<std::optional<Element>()>()> make,
                                            int64_t cardinality) {
  if (!make) throw ValueError("Dataset.from_generator: received an empty factory function");
  if (cardinality < kUnknownCardinality) {
    throw ValueError("Dataset.from_generator: invalid cardinality " + std::to_string(cardinality) +
                     ", expected a count >= 0, kInfiniteCardinality or kUnknownCardinality");
  }
  return data::Dataset(std::make_shared<GeneratorNode>(std::move(make), cardinality));
}

data::Dataset data::Dataset::map(std::function<Element(const Element&)> fn, int num_parallel_calls) const {
  if (!fn) throw ValueError("Dataset.map: received an empty function");
  if (num_parallel_calls == kAutotune) {
    num_parallel_calls = std::max(1u, std::thread::hardware_concurrency());
  }
  if (num_parallel_calls <= 0) {
    throw ValueError(
        "Dataset.map: received an invalid value for `num_parallel_calls`, expected a positive "
        "integer or kAutotune (-1). Received: num_parallel_calls=" +
        std::to_string(num_parallel_calls));
  }
  return data::Dataset(make_map_node(node_, std::move(fn), num_parallel_calls));
}

data::Dataset data::Dataset::shuffle(int64_t buffer_size, std::optional<uint64_t> seed,
                                     bool reshuffle_each_iteration) const {
  require_positive("shuffle", "buffer_size", buffer_size);
  return data::Dataset(make_shuffle_node(node_, buffer_size, seed ? *seed : next_seed(), reshuffle_each_iteration));
}

data::Dataset data::Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  require_positive("batch", "batch_size", batch_size);
  return data::Dataset(make_batch_node(node_, batch_size, drop_remainder));
}

data::Dataset data::Dataset::unbatch() const { return data::Dataset(make_unbatch_node(node_)); }

data::Dataset data::Dataset::repeat(int64_t count) const {
  if (count < -1) {
    throw ValueError(
        "Dataset.repeat: received an invalid value for `count`, expected -1 (forever) or a count "
        ">= 0. Received: count=" +
        std::to_string(count));
  }
  return data::Dataset(make_repeat_node(node_, count));
}

data::Dataset data::Dataset::take(int64_t n) const {
  if (n < -1) {
    throw ValueError(
        "Dataset.take: received an invalid value for `count`, expected -1 (all) or a count >= 0. "
        "Received: count=" +
        std::to_string(n));
  }
  return data::Dataset(make_take_node(node_, n));
}

data::Dataset data::Dataset::skip(int64_t n) const {
  if (n < -1) {
    throw ValueError(
        "Dataset.skip: received an invalid value for `count`, expected -1 (all) or a count >= 0. "
        "Received: count=" +
        std::to_string(n));
  }
  return data::Dataset(make_skip_node(node_, n));
}

data::Dataset data::Dataset::cache(const std::string& filename) const {
  return data::Dataset(make_cache_node(node_, filename));
}

data::Dataset data::Dataset::cache_on_device(const std::string& device) const {
  const at::Device d = device.empty() ? default_device() : resolve_device(device, "Dataset.cache_on_device");
  return data::Dataset(make_cache_node(node_, "", d));
}

data::Dataset data::Dataset::prefetch(int64_t buffer_size) const {
  if (buffer_size == kAutotune) buffer_size = 2;
  require_positive("prefetch", "buffer_size", buffer_size);
  return data::Dataset(make_prefetch_node(node_, buffer_size));
}

data::Dataset data::Dataset::shard(int64_t num_shards, int64_t index) const {
  require_positive("shard", "num_shards", num_shards);
  if (index < 0 || index >= num_shards) {
    throw ValueError("Dataset.shard: received an invalid value for `index`, expected 0 <= index < num_shards=" +
                     std::to_string(num_shards) + ". Received: index=" + std::to_string(index));
  }
  return data::Dataset(make_shard_node(node_, num_shards, index));
}

std::unique_ptr<data::DatasetIterator> data::Dataset::iterator(int64_t epoch) const {
  return node_->make_iterator(static_cast<uint64_t>(epoch));
}

int64_t data::Dataset::cardinality() const { return node_->cardinality(); }

}  // namespace kiln
