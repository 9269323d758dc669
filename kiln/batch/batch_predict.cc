#include "kiln/batch/batch_predict.h"
#include "kiln/batch/instances.h"

#include <glob.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <mutex>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/json.h"
#include "kiln/core/tensor_json.h"
#include "kiln/core/thread_pool.h"
#include "kiln/models/model.h"

namespace kiln::batch {
namespace {

constexpr const char* kResults = "prediction.results";
constexpr const char* kErrors = "prediction.errors_stats";

// One input line of a shard.
struct Item {
  std::string file;
  int64_t line_no = 0;
  std::string text;
  Instance values;
};

// Where a shard's first line starts.
struct ShardStart {
  size_t file = 0;
  std::streamoff offset = 0;
  int64_t line_no = 1;
};

// --- output -------------------------------------------------------------------
std::string escape_json(const std::string& s) { return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace); }

// --- the run ------------------------------------------------------------------
class Worker {
 public:
  explicit Worker(const std::string& model_dir) : model_(load_model(model_dir)), inputs_(instance_inputs(*model_)) {
    output_names_ = model_->output_names();
  }

  // Predicts `items` (parsed ones) and appends result lines; errors go to `errors`.
  void run_shard(std::vector<Item>& items, std::string& results, std::string& errors, int64_t batch_size, int64_t& n_ok,
                 int64_t& n_err) {
    std::vector<Item*> batch;
    auto flush = [&] {
      if (batch.empty()) return;
      predict_batch(batch, results, errors, n_ok, n_err);
      batch.clear();
    };
    for (auto& item : items) {
      try {
        item.values = parse_instance(item.text, inputs_);
      } catch (const UserError& e) {
        // Errors go to their own file but the results keep input order.
        flush();
        add_error(errors, item, e.what());
        ++n_err;
        continue;
      } catch (const nlohmann::json::exception& e) {
        flush();
        add_error(errors, item, std::string("a JSON value has the wrong type: ") + e.what());
        ++n_err;
        continue;
      }
      if (!batch.empty() && !same_shapes(item.values, batch[0]->values)) flush();
      batch.push_back(&item);
      if ((int64_t)batch.size() >= batch_size) flush();
    }
    flush();
  }

 private:
  void add_error(std::string& errors, const Item& item, const std::string& message) {
    errors += "{\"file\":" + escape_json(item.file) + ",\"line\":" + std::to_string(item.line_no) +
              ",\"instance\":" + escape_json(item.text) + ",\"error\":" + escape_json(message) + "}\n";
  }

  void predict_batch(const std::vector<Item*>& batch, std::string& results, std::string& errors, int64_t& n_ok,
                     int64_t& n_err) {
    const int64_t n = batch.size();
    Tensors y;
    try {
      std::vector<const Instance*> instances;
      for (auto* item : batch) instances.push_back(&item->values);
      y = model_->predict(stack_instances(instances, inputs_), {.batch_size = n});
    } catch (const std::exception& e) {
      if (n > 1) {  // find the instance(s) at fault
        for (auto* item : batch) predict_batch({item}, results, errors, n_ok, n_err);
        return;
      }
      std::string m = e.what();
      if (auto c = dynamic_cast<const c10::Error*>(&e)) m = c->what_without_backtrace();
      m = m.substr(0, m.find('\n'));
      add_error(errors, *batch[0], "prediction failed: " + m);
      ++n_err;
      return;
    }
    for (int64_t r = 0; r < n; ++r) {
      results += "{\"instance\":" + batch[r]->text + ",\"prediction\":";
      if (y.size() == 1) {
        append_tensor_json(results, y[0][r]);
      } else {
        results += '{';
        for (size_t k = 0; k < y.size(); ++k) {
          if (k) results += ',';
          results += escape_json(k < output_names_.size() ? output_names_[k] : "output_" + std::to_string(k)) + ":";
          append_tensor_json(results, y[k][r]);
        }
        results += '}';
      }
      results += "}\n";
      ++n_ok;
    }
  }

  ModelPtr model_;
  std::vector<InstanceInput> inputs_;
  std::vector<std::string> output_names_;
};

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  size_t b = s.find_first_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b);
}

// Counts lines and records where each shard starts.
std::vector<ShardStart> index_shards(const std::vector<std::string>& files, int64_t per_shard) {
  std::vector<ShardStart> starts;
  int64_t global = 0;
  for (size_t f = 0; f < files.size(); ++f) {
    std::ifstream in(files[f], std::ios::binary);
    if (!in) throw NotFoundError("cannot read --input " + files[f]);
    std::string line;
    int64_t line_no = 0;
    std::streamoff offset = 0;
    while (true) {
      std::streamoff here = offset;
      if (!std::getline(in, line)) break;
      offset = in.tellg();
      if (offset < 0) offset = here + line.size() + 1;
      ++line_no;
      if (global % per_shard == 0) starts.push_back({f, here, line_no});
      ++global;
    }
  }
  return starts;
}

std::vector<Item> read_shard(const std::vector<std::string>& files, const ShardStart& s, int64_t count) {
  std::vector<Item> items;
  size_t f = s.file;
  std::streamoff offset = s.offset;
  int64_t line_no = s.line_no;
  int64_t read = 0;
  while (read < count && f < files.size()) {
    std::ifstream in(files[f], std::ios::binary);
    if (!in) throw NotFoundError("cannot read --input " + files[f]);
    in.seekg(offset);
    std::string line;
    while (read < count && std::getline(in, line)) {
      ++read;
      std::string t = trim(line);
      if (!t.empty()) items.push_back({files[f], line_no, std::move(t), {}});
      ++line_no;
    }
    ++f;
    offset = 0;
    line_no = 1;
  }
  return items;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

}  // namespace

void BatchPredictOptions::validate() const {
  if (model_dir.empty()) throw ValueError("batch_predict: `model_dir` is empty; pass --model DIR");
  if (inputs.empty()) throw ValueError("batch_predict: no inputs; pass --input FILE.jsonl (globs allowed)");
  if (output_dir.empty()) throw ValueError("batch_predict: `output_dir` is empty; pass --output DIR");
  auto positive = [](int64_t v, const char* name) {
    if (v <= 0)
      throw ValueError(std::string("batch_predict: received an invalid value for `") + name +
                       "`, expected a positive integer. Received: " + name + "=" + std::to_string(v));
  };
  positive(workers, "workers");
  positive(batch_size, "batch_size");
  positive(lines_per_shard, "lines_per_shard");
}

std::string shard_file_name(const std::string& kind, int64_t shard, int64_t num_shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05lld-of-%05lld", (long long)shard, (long long)num_shards);
  return kind + buf;
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> files;
  for (auto& p : patterns) {
    glob_t g{};
    int rc = ::glob(p.c_str(), 0, nullptr, &g);  // glob sorts its matches
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
      globfree(&g);
      throw NotFoundError("--input " + p + " matches no file");
    }
    if (rc != 0) {
      globfree(&g);
      throw IOError("cannot expand --input " + p);
    }
    for (size_t i = 0; i < g.gl_pathc; ++i) files.push_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return files;
}

BatchPredictReport batch_predict(const BatchPredictOptions& o) {
  o.validate();
  const auto files = expand_inputs(o.inputs);
  const auto starts = index_shards(files, o.lines_per_shard);
  BatchPredictReport report;
  report.num_shards = std::max<int64_t>(1, starts.size());
  const int64_t n = report.num_shards;
  make_dirs(o.output_dir);

  // Leftovers of an earlier run: temporary files go; shards of another count refuse.
  std::vector<bool> done(n, false);
  const std::string suffix = "-of-" + shard_file_name("", 0, n).substr(10);
  for (auto& name : list_directory(o.output_dir)) {
    if (starts_with(name, ".prediction.") && name.find(".tmp-") != std::string::npos) {
      remove_all(join_path(o.output_dir, name));
      continue;
    }
    if (!starts_with(name, "prediction.")) continue;
    bool is_results = starts_with(name, std::string(kResults) + "-");
    if (!is_results && !starts_with(name, std::string(kErrors) + "-")) continue;
    if (name.size() < suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      throw ValueError("output directory " + o.output_dir + " holds " + name +
                       " from a run with another number of shards (this run has " + std::to_string(n) +
                       "); use an empty --output directory or the same inputs and --lines_per_shard");
    if (is_results) {
      int64_t k = std::atoll(name.c_str() + std::string(kResults).size() + 1);
      if (k >= 0 && k < n) done[k] = true;
    }
  }
  for (int64_t k = 0; k < n; ++k)
    if (done[k]) ++report.shards_skipped;

  // Test hook: slows workers down so a test can kill a run between shards.
  int64_t delay_ms = 0;
  if (const char* d = std::getenv("KILN_BATCH_PREDICT_TEST_DELAY_MS")) delay_ms = std::atoll(d);

  std::atomic<int64_t> next{0};
  std::mutex mu;  // guards report counters and first_error
  std::exception_ptr first_error;
  auto work = [&] {
    try {
      std::unique_ptr<Worker> worker;  // loaded on the first shard that needs work
      while (true) {
        int64_t k = next.fetch_add(1);
        if (k >= n) break;
        if (done[k]) continue;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (first_error) break;
        }
        if (!worker) worker = std::make_unique<Worker>(o.model_dir);
        std::vector<Item> items;
        if (!starts.empty()) items = read_shard(files, starts[k], o.lines_per_shard);
        std::string results, errors;
        int64_t ok = 0, err = 0;
        worker->run_shard(items, results, errors, o.batch_size, ok, err);
        // Errors first: the results file marks the shard as done.
        atomic_write_file(join_path(o.output_dir, shard_file_name(kErrors, k, n)), errors);
        atomic_write_file(join_path(o.output_dir, shard_file_name(kResults, k, n)), results);
        {
          std::lock_guard<std::mutex> lock(mu);
          report.shards_written++;
          report.predictions += ok;
          report.errors += err;
        }
        if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!first_error) first_error = std::current_exception();
    }
  };
  // The calling thread is one of the workers; the pool runs the others.
  const int64_t threads = std::min<int64_t>(o.workers, n);
  std::unique_ptr<ThreadPool> pool;
  std::vector<std::future<void>> others;
  if (threads > 1) {
    pool = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = static_cast<int>(threads - 1)});
    for (int64_t t = 1; t < threads; ++t) others.push_back(pool->submit(work));
  }
  work();
  for (auto& f : others) f.get();  // work() catches its own errors into first_error
  if (first_error) std::rethrow_exception(first_error);
  return report;
}

}  // namespace kiln::batch
