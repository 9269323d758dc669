#include "kiln/tuning/trial_store.h"

#include <sqlite3.h>

#include <filesystem>

#include "kiln/core/error.h"

namespace kiln::tuning {

namespace {

struct Statement {
  sqlite3_stmt* s = nullptr;
  Statement(sqlite3* db, const std::string& sql, const std::string& path) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) != SQLITE_OK)
      throw IOError("trial store " + path + ": " + sqlite3_errmsg(db));
  }
  ~Statement() { sqlite3_finalize(s); }
};

}  // namespace

TrialStore::TrialStore(const std::string& path, bool read_only) : path_(path) {
  namespace fs = std::filesystem;
  if (read_only && !fs::exists(path))
    throw NotFoundError("no tuning results at " + path + "; run `kiln tune` first or check the directory");
  if (!read_only && fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  int flags = read_only ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  if (sqlite3_open_v2(path.c_str(), &db_, flags | SQLITE_OPEN_FULLMUTEX, nullptr) != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw IOError("cannot open trial store " + path + ": " + msg);
  }
  sqlite3_busy_timeout(db_, 10000);
  try {
    if (!read_only) {
      exec("PRAGMA journal_mode=WAL");
      exec("PRAGMA synchronous=FULL");
      exec(
          "CREATE TABLE IF NOT EXISTS trials (seq INTEGER PRIMARY KEY AUTOINCREMENT, trial_id TEXT UNIQUE "
          "NOT NULL,"
          " status TEXT NOT NULL, score REAL, json TEXT NOT NULL)");
      exec("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
    }
    // A file that is not an SQLite database fails here with a clear message.
    (void)journal_mode();
    Statement check(db_, "SELECT count(*) FROM trials", path_);
  } catch (const IOError& e) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw FormatError("trial store " + path + " is not a kiln tuning database (" + e.what() + ")");
  }
}

TrialStore::~TrialStore() {
  if (db_) sqlite3_close(db_);
}

void TrialStore::exec(const std::string& sql) const {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw IOError("trial store " + path_ + ": " + msg + " (in: " + sql + ")");
  }
}

void TrialStore::put_trial(const Trial& t) {
  std::lock_guard<std::mutex> l(mu_);
  Statement st(db_,
               "INSERT INTO trials (trial_id, status, score, json) VALUES (?1, ?2, ?3, ?4) "
               "ON CONFLICT(trial_id) DO UPDATE SET status=excluded.status, score=excluded.score, json=excluded.json",
               path_);
  const std::string json = t.to_json().dump();
  const std::string status = status_name(t.status);
  sqlite3_bind_text(st.s, 1, t.trial_id.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 2, status.c_str(), -1, SQLITE_TRANSIENT);
  if (t.score)
    sqlite3_bind_double(st.s, 3, *t.score);
  else
    sqlite3_bind_null(st.s, 3);
  sqlite3_bind_text(st.s, 4, json.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_DONE) throw IOError("trial store " + path_ + ": " + sqlite3_errmsg(db_));
}

std::vector<Trial> TrialStore::load_trials() const {
  std::lock_guard<std::mutex> l(mu_);
  Statement st(db_, "SELECT json FROM trials ORDER BY seq", path_);
  std::vector<Trial> out;
  int rc;
  while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
    const char* text = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 0));
    out.push_back(Trial::from_json(parse_json(text ? text : "", path_ + " (trial row)")));
  }
  if (rc != SQLITE_DONE) throw IOError("trial store " + path_ + ": " + sqlite3_errmsg(db_));
  return out;
}

void TrialStore::put_state(const std::string& key, const Json& value) {
  std::lock_guard<std::mutex> l(mu_);
  Statement st(
      db_, "INSERT INTO state (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value=excluded.value", path_);
  const std::string v = value.dump();
  sqlite3_bind_text(st.s, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st.s, 2, v.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_DONE) throw IOError("trial store " + path_ + ": " + sqlite3_errmsg(db_));
}

std::optional<Json> TrialStore::get_state(const std::string& key) const {
  std::lock_guard<std::mutex> l(mu_);
  Statement st(db_, "SELECT value FROM state WHERE key = ?1", path_);
  sqlite3_bind_text(st.s, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  if (sqlite3_step(st.s) != SQLITE_ROW) return std::nullopt;
  const char* text = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 0));
  return parse_json(text ? text : "", path_ + " (state " + key + ")");
}

std::string TrialStore::journal_mode() const {
  Statement st(db_, "PRAGMA journal_mode", path_);
  if (sqlite3_step(st.s) != SQLITE_ROW) return "";
  return reinterpret_cast<const char*>(sqlite3_column_text(st.s, 0));
}

}  // namespace kiln::tuning
