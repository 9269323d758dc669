// TrialStore: the crash-safe record of a search (docs/TUNING.md, "State
// and resume"): an SQLite database in WAL mode with one row per trial
// (hyperparameters, status, per-epoch metrics, score, checkpoint, as the
// Trial's JSON plus indexed columns) and a key/value table for the oracle's
// own state. Every write is one transaction, synchronous=FULL, so `kill -9`
// at any moment leaves either the old or the new row, never half of one.
//
//   auto store = std::make_shared<TrialStore>(dir + "/trials.db");
//   store->put_trial(trial);
//   for (auto& t : store->load_trials()) ...
//
// Thread safety: methods lock; one connection per store object. Several
// processes may open the same file (SQLite's locking; busy timeout 10 s).
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/tuning/trial.h"

struct sqlite3;

namespace kiln::tuning {

class TrialStore {
 public:
  // Opens or creates the database (parent directories are created).
  // read_only: for `kiln tune --summary` (NotFoundError if absent).
  explicit TrialStore(const std::string& path, bool read_only = false);
  ~TrialStore();
  TrialStore(const TrialStore&) = delete;
  TrialStore& operator=(const TrialStore&) = delete;

  void put_trial(const Trial& trial);
  std::vector<Trial> load_trials() const;  // in creation order
  void put_state(const std::string& key, const Json& value);
  std::optional<Json> get_state(const std::string& key) const;
  // "wal" when WAL mode is on.
  std::string journal_mode() const;
  const std::string& path() const { return path_; }

 private:
  void exec(const std::string& sql) const;
  std::string path_;
  sqlite3* db_ = nullptr;
  mutable std::mutex mu_;  // guards db_
};

}  // namespace kiln::tuning
