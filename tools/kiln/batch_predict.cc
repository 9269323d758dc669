// kiln batch-predict --model DIR --input FILES.jsonl... --output DIR
//                    [--workers N] [--batch_size B] [--lines_per_shard L]
//
// Vertex AI-style batch prediction: JSON Lines in, sharded
// prediction.results-0000K-of-0000N and prediction.errors_stats-* files out.
// Re-running after a crash keeps finished shards. See docs/BATCH_PREDICT.md
// and kiln/batch/batch_predict.h.
#include <iostream>
#include <memory>

#include "kiln/batch/batch_predict.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {

Command add_batch_predict_command(CLI::App& app) {
  auto o = std::make_shared<batch::BatchPredictOptions>();
  CLI::App* sub = app.add_subcommand("batch-predict", "Predict JSON Lines files into sharded result files");
  sub->add_option("--model", o->model_dir, "A model version directory, e.g. models/fashion_mnist/1")->required();
  sub->add_option("--input", o->inputs, "JSON Lines files or glob patterns (one instance per line)")
      ->required()
      ->expected(1, -1);
  sub->add_option("--output", o->output_dir, "Directory for prediction.results-* and prediction.errors_stats-*")
      ->required();
  sub->add_option("--workers", o->workers, "Worker threads, each with its own copy of the model")
      ->check(positive_integer());
  sub->add_option("--batch_size", o->batch_size, "Instances per forward pass")->check(positive_integer());
  sub->add_option("--lines_per_shard", o->lines_per_shard, "Input lines per output shard")->check(positive_integer());
  return {sub, [o] {
            auto r = batch::batch_predict(*o);
            std::cout << "batch-predict: " << r.num_shards << " shard(s): " << r.shards_written << " written, "
                      << r.shards_skipped << " already done; " << r.predictions << " prediction(s), " << r.errors
                      << " error(s) in " << o->output_dir << std::endl;
          }};
}

}  // namespace kiln::cli
