// Running trials as processes: metric reports, command trials, --parallel,
// `kiln tune --resume` after kill -9, and the distributed chief/workers.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/testing/expect_error.h"
#include "kiln/training/tfevents.h"
#include "kiln/tuning/hparams_summary.h"
#include "kiln/tuning/metric_report.h"
#include "kiln/tuning/oracle_service.h"
#include "kiln/tuning/oracles.h"
#include "kiln/tuning/trial_runner.h"
#include "kiln/tuning/trial_store.h"
#include "kiln/tuning/tune_spec.h"
#include "tensorboard/plugins/hparams/plugin_data.pb.h"
#include "tensorflow/core/util/event.pb.h"

namespace kiln::tuning {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Every Event in the event files directly inside `dir`, in file order; each
// TFRecord's CRCs are checked on the way.
std::vector<tensorflow::Event> read_events(const std::string& dir) {
  std::vector<tensorflow::Event> out;
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (auto& f : files) {
    std::string bytes = read_file(f);
    size_t at = 0;
    while (at < bytes.size()) {
      EXPECT_LE(at + 12, bytes.size()) << f;
      uint64_t len;
      uint32_t len_crc, data_crc;
      std::memcpy(&len, bytes.data() + at, 8);
      std::memcpy(&len_crc, bytes.data() + at + 8, 4);
      EXPECT_EQ(len_crc, masked_crc32c(bytes.data() + at, 8));
      std::string data = bytes.substr(at + 12, len);
      std::memcpy(&data_crc, bytes.data() + at + 12 + len, 4);
      EXPECT_EQ(data_crc, masked_crc32c(data.data(), data.size()));
      tensorflow::Event ev;
      EXPECT_TRUE(ev.ParseFromString(data));
      out.push_back(ev);
      at += 12 + len + 4;
    }
  }
  return out;
}

// The "hparams" plugin data of the summary tagged `tag`; false if none.
bool find_hparams(const std::vector<tensorflow::Event>& events, const std::string& tag,
                  tensorboard::hparams::HParamsPluginData* out) {
  for (auto& ev : events)
    for (auto& v : ev.summary().value())
      if (v.tag() == tag) {
        EXPECT_EQ(v.metadata().plugin_data().plugin_name(), "hparams");
        return out->ParseFromString(v.metadata().plugin_data().content());
      }
  return false;
}

std::string temp_dir(const std::string& name) {
  std::string d = (fs::temp_directory_path() / ("kiln_tunerun_" + name + "_" + std::to_string(getpid()))).string();
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write_script(const std::string& dir, const std::string& name, const std::string& body) {
  std::string path = dir + "/" + name;
  std::ofstream(path) << "#!/bin/sh\n" << body;
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Waits for `cond` with a deadline; false on timeout.
template <class F>
bool wait_for(F&& cond, double seconds) {
  auto until = Clock::now() + std::chrono::milliseconds((int)(seconds * 1000));
  while (Clock::now() < until) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

// A trial program: score = -(x-3)^2 + 0.1*step for steps 0..steps-1,
// sleeping `pause` s per step; appends its trial id to $DONE_FILE at the end.
const char* kProgram = R"(x=0; steps=3; pause=0
for a in "$@"; do case "$a" in --x=*) x="${a#--x=}";; --steps=*) steps="${a#--steps=}";; --pause=*) pause="${a#--pause=}";; esac; done
i=0
while [ $i -lt $steps ]; do
  sleep $pause
  v=$(awk -v x="$x" -v i="$i" 'BEGIN{print -(x-3)*(x-3) + i*0.1}')
  echo "kiln-metric score=$v step=$i"
  i=$((i+1))
done
[ -n "$DONE_FILE" ] && echo "$KILN_TRIAL_ID" >> "$DONE_FILE"
exit 0
)";

Json space_x() { return Json::array({{{"type", "Int"}, {"name", "x"}, {"min_value", 0}, {"max_value", 20}}}); }

std::shared_ptr<Oracle> random_oracle(int max_trials, std::shared_ptr<Pruner> pruner = nullptr) {
  OracleOptions o;
  o.objective = Objective("score", Direction::kMax);
  o.max_trials = max_trials;
  o.seed = 7;
  o.pruner = std::move(pruner);
  auto oracle = make_oracle("random_search", o);
  oracle->update_space(HyperParameters::from_json(space_x()));
  return oracle;
}

// --- metric reports --------------------------------------------------------------------------

TEST(MetricReport, ParsesKilnMetricLines) {
  auto r = parse_metric_line("kiln-metric val_accuracy=0.875 loss=0.41 step=3");
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(r->metrics.at("val_accuracy"), 0.875);
  EXPECT_DOUBLE_EQ(r->metrics.at("loss"), 0.41);
  EXPECT_EQ(r->step, 3);
  r = parse_metric_line("  kiln-metric acc=1e-2\r\n");
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(r->metrics.at("acc"), 0.01);
  EXPECT_FALSE(r->step);
  EXPECT_FALSE(parse_metric_line("Epoch 1/3 - loss: 0.5"));
  EXPECT_FALSE(parse_metric_line("kiln-metrics are nice"));
  expect_error<FormatError>([] { parse_metric_line("kiln-metric acc"); },
                            {"'acc' is not NAME=VALUE", "kiln-metric NAME=VALUE"});
  expect_error<FormatError>([] { parse_metric_line("kiln-metric acc=high"); }, {"'acc' is not a number"});
  expect_error<FormatError>([] { parse_metric_line("kiln-metric acc=0.5 step=1.5"); },
                            {"step must be a non-negative integer"});
  expect_error<FormatError>([] { parse_metric_line("kiln-metric step=2"); }, {"no metric"});
}

TEST(MetricReport, FormattedLinesParseBackExactly) {
  std::map<std::string, double> m = {{"val_accuracy", 0.1 + 0.2}, {"loss", 1.0 / 3.0}};
  auto r = parse_metric_line(format_metric_line(m, 4));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->metrics, m);  // bit-exact doubles
  EXPECT_EQ(r->step, 4);
}

TEST(MetricReport, ParsesHypertuneLines) {
  // cloudml-hypertune writes values as strings.
  auto r = parse_hypertune_line(R"({"timestamp": 1700000000.5, "trial": "3", "accuracy": "0.91", "global_step": "4"})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->metrics.size(), 1u);
  EXPECT_DOUBLE_EQ(r->metrics.at("accuracy"), 0.91);
  EXPECT_EQ(r->step, 4);
  r = parse_hypertune_line(R"({"val_loss": 0.25})");
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(r->metrics.at("val_loss"), 0.25);
  EXPECT_FALSE(parse_hypertune_line("   "));
  expect_error<FormatError>([] { parse_hypertune_line("{\"acc\": 0.5"); }, {"not valid JSON"});
  expect_error<FormatError>([] { parse_hypertune_line("[1, 2]"); }, {"not a JSON object"});
  expect_error<FormatError>([] { parse_hypertune_line(R"({"acc": "n/a"})"); }, {"\"acc\" is not a number"});
  expect_error<FormatError>([] { parse_hypertune_line(R"({"acc": 1, "global_step": -1})"); }, {"global_step"});
}

TEST(MetricReport, HypertuneReaderReturnsOnlyCompleteNewLines) {
  std::string dir = temp_dir("reader");
  std::string path = dir + "/output.metrics";
  HypertuneFileReader reader(path);
  EXPECT_TRUE(reader.poll().empty());  // missing file
  { std::ofstream(path, std::ios::app) << "{\"a\": 1}\n{\"a\": "; }
  auto lines = reader.poll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "{\"a\": 1}");
  { std::ofstream(path, std::ios::app) << "2}\n"; }
  lines = reader.poll();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "{\"a\": 2}");
  EXPECT_TRUE(reader.poll().empty());
  StepCounter steps;
  EXPECT_EQ(steps.assign({{}, std::nullopt}), 0);
  EXPECT_EQ(steps.assign({{}, 5}), 5);
  EXPECT_EQ(steps.assign({{}, std::nullopt}), 6);
  fs::remove_all(dir);
}

TEST(TrialRunner, ArgumentsAreNameEqualsValueAndHyperbandEpochs) {
  HyperParameters hp;
  hp.Int("units", 16, 64);
  hp.Float("lr", 1e-4, 1e-1, {.sampling = Sampling::kLog});
  hp.Boolean("dropout");
  hp.set("lr", 0.00123);
  hp.set("tuner/epochs", int64_t{9});
  hp.set("tuner/trial_id", std::string("4"));
  auto args = trial_arguments(hp);
  std::set<std::string> got(args.begin(), args.end());
  EXPECT_TRUE(got.count("--units=16"));
  EXPECT_TRUE(got.count("--lr=0.00123"));
  EXPECT_TRUE(got.count("--dropout=false"));
  EXPECT_TRUE(got.count("--epochs=9"));
  EXPECT_EQ(got.size(), 4u) << "tuner/trial_id is not passed";
  CommandOptions bad;
  expect_error<ValueError>([&] { bad.validate(); }, {"command"});
}

// --- command trials --------------------------------------------------------------------------

TEST(CommandTrials, RandomSearchEndToEndWithStdoutAndHypertuneReports) {
  std::string dir = temp_dir("e2e");
  std::string prog = write_script(dir, "prog.sh", kProgram);
  // A second program reporting through hypertune's file instead of stdout.
  std::string ht = write_script(dir, "ht.sh", R"(for a in "$@"; do case "$a" in --x=*) x="${a#--x=}";; esac; done
echo '{"score": "'$((x * 2))'", "global_step": "0", "timestamp": 1}' >> "$CLOUD_ML_HP_METRIC_FILE"
echo "ordinary output"; echo "kiln-metric broken" )");
  for (std::string cmd : {prog + " --steps=3", ht}) {
    auto oracle = random_oracle(4);
    OracleSource source(oracle);
    CommandOptions c;
    c.command = cmd;
    c.trials_dir = dir + "/trials_" + std::to_string(cmd == ht);
    c.objective = "score";
    c.tensorboard_dir = c.trials_dir + "/logs";
    c.verbose = 0;
    EXPECT_EQ(run_command_trials(source, c), 4);
    auto trials = oracle->trials();
    ASSERT_EQ(trials.size(), 4u);
    for (auto& t : trials) {
      EXPECT_EQ(t.status, TrialStatus::kCompleted) << t.message;
      int64_t x = t.hyperparameters.get_int("x");
      ASSERT_TRUE(t.score);
      if (cmd == ht) {
        EXPECT_DOUBLE_EQ(*t.score, 2.0 * x);
        EXPECT_NE(slurp(c.trials_dir + "/trial_" + t.trial_id + "/stderr.log").find("malformed metric line"),
                  std::string::npos);
      } else {
        EXPECT_NEAR(*t.score, -(x - 3.0) * (x - 3.0) + 0.2, 1e-9);
        EXPECT_EQ(t.best_step, 2);
        EXPECT_EQ(t.metrics.at("score").size(), 3u);
      }
      EXPECT_TRUE(fs::exists(c.trials_dir + "/trial_" + t.trial_id + "/stdout.log"));
      EXPECT_TRUE(fs::exists(c.trials_dir + "/logs/trial_" + t.trial_id + "/hparams.json"));
      // TensorBoard's HParams tab: the session's values and status, and its scalars, in its run.
      auto events = read_events(c.trials_dir + "/logs/trial_" + t.trial_id);
      tensorboard::hparams::HParamsPluginData start, end;
      ASSERT_TRUE(find_hparams(events, "_hparams_/session_start_info", &start));
      EXPECT_EQ(start.session_start_info().hparams().at("x").number_value(), static_cast<double>(x));
      EXPECT_EQ(start.session_start_info().group_name(), t.trial_id);
      ASSERT_TRUE(find_hparams(events, "_hparams_/session_end_info", &end));
      EXPECT_EQ(end.session_end_info().status(), tensorboard::hparams::STATUS_SUCCESS);
      std::vector<double> scores;
      for (auto& ev : events)
        for (auto& v : ev.summary().value())
          if (v.tag() == "score") scores.push_back(v.simple_value());
      ASSERT_EQ(scores.size(), cmd == ht ? 1u : 3u);
      EXPECT_NEAR(*std::max_element(scores.begin(), scores.end()), *t.score, 1e-5 * (1 + std::fabs(*t.score)));
    }
  }
  fs::remove_all(dir);
}

TEST(HParamsSummary, ExperimentListsEveryHyperparameterWithItsDomain) {
  std::string dir = temp_dir("hparams");
  HyperParameters space;
  space.Int("units", 32, 256, {.step = 32});
  space.Float("lr", 1e-4, 1e-2, {.sampling = Sampling::kLog});
  space.Boolean("dropout");
  space.Choice("act", std::vector<std::string>{"relu", "tanh"});
  {
    EventFileWriter w(dir);
    write_hparams_experiment(w, space, {"val_accuracy", "loss"}, 1000.0);
  }
  auto events = read_events(dir);
  ASSERT_EQ(events.size(), 2u);  // file version, experiment
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  tensorboard::hparams::HParamsPluginData data;
  ASSERT_TRUE(find_hparams(events, "_hparams_/experiment", &data));
  const auto& ex = data.experiment();
  ASSERT_EQ(ex.hparam_infos_size(), 4);
  std::map<std::string, tensorboard::hparams::HParamInfo> by_name;
  for (auto& h : ex.hparam_infos()) by_name[h.name()] = h;
  EXPECT_EQ(by_name["units"].domain_interval().min_value(), 32);
  EXPECT_EQ(by_name["units"].domain_interval().max_value(), 256);
  EXPECT_EQ(by_name["lr"].type(), tensorboard::hparams::DATA_TYPE_FLOAT64);
  EXPECT_DOUBLE_EQ(by_name["lr"].domain_interval().max_value(), 1e-2);
  EXPECT_EQ(by_name["dropout"].type(), tensorboard::hparams::DATA_TYPE_BOOL);
  EXPECT_EQ(by_name["dropout"].domain_discrete().values_size(), 2);
  EXPECT_EQ(by_name["act"].type(), tensorboard::hparams::DATA_TYPE_STRING);
  ASSERT_EQ(by_name["act"].domain_discrete().values_size(), 2);
  EXPECT_EQ(by_name["act"].domain_discrete().values(1).string_value(), "tanh");
  ASSERT_EQ(ex.metric_infos_size(), 2);
  EXPECT_EQ(ex.metric_infos(0).name().tag(), "val_accuracy");
  EXPECT_EQ(ex.metric_infos(0).dataset_type(), tensorboard::hparams::DATASET_VALIDATION);
  fs::remove_all(dir);
}

TEST(CommandTrials, FailuresAndMissingObjectiveFailTheTrial) {
  std::string dir = temp_dir("fail");
  std::string crash = write_script(dir, "crash.sh", "echo 'out of cheese' >&2; exit 3\n");
  std::string silent = write_script(dir, "silent.sh", "echo 'kiln-metric other=1'\n");
  for (auto& cmd : {crash, silent}) {
    auto oracle = random_oracle(1);
    OracleSource source(oracle);
    CommandOptions c{.command = cmd, .trials_dir = dir + "/t", .objective = "score", .verbose = 0};
    run_command_trials(source, c);
    auto t = oracle->trials().at(0);
    EXPECT_EQ(t.status, TrialStatus::kFailed);
    if (cmd == crash) {
      EXPECT_NE(t.message.find("exited with status 3"), std::string::npos) << t.message;
      EXPECT_NE(t.message.find("out of cheese"), std::string::npos) << t.message;
    } else {
      EXPECT_NE(t.message.find("never reported the objective 'score'"), std::string::npos) << t.message;
    }
  }
  fs::remove_all(dir);
}

// Prunes every trial at step 1.
class PruneAtStepOne : public Pruner {
 public:
  bool should_prune(const Trial&, int step, const std::vector<const Trial*>&, const Objective&) const override {
    return step >= 1;
  }
  Json to_json() const override { return "test"; }
};

TEST(CommandTrials, PrunedTrialsAreStoppedAndTheirProcessKilled) {
  std::string dir = temp_dir("prune");
  std::string prog = write_script(dir, "prog.sh", kProgram);
  auto oracle = random_oracle(1, std::make_shared<PruneAtStepOne>());
  OracleSource source(oracle);
  ::setenv("DONE_FILE", (dir + "/done").c_str(), 1);
  CommandOptions c{
      .command = prog + " --steps=200 --pause=0.05", .trials_dir = dir + "/t", .objective = "score", .verbose = 0};
  auto start = Clock::now();
  run_command_trials(source, c);
  ::unsetenv("DONE_FILE");
  auto t = oracle->trials().at(0);
  EXPECT_EQ(t.status, TrialStatus::kStopped);
  EXPECT_LE(t.metrics.at("score").size(), 3u);
  EXPECT_FALSE(fs::exists(dir + "/done")) << "the pruned program ran to its end";
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 8.0);
  fs::remove_all(dir);
}

TEST(CommandTrials, ParallelTwoRunsTrialsConcurrently) {
  std::string dir = temp_dir("parallel");
  // Each trial marks its start, then waits (up to 10 s) to see another
  // trial's mark, and reports how many it saw: 2 only if they overlapped.
  std::string prog = write_script(dir, "par.sh", "touch \"" + dir + "/start.$KILN_TRIAL_ID\"\n" + R"(n=1; i=0
while [ $i -lt 200 ]; do
  n=$(ls ")" + dir + R"(" | grep -c '^start\.')
  [ "$n" -ge 2 ] && break
  sleep 0.05; i=$((i+1))
done
echo "kiln-metric score=$n"
)");
  auto oracle = random_oracle(2);
  OracleSource source(oracle);
  CommandOptions c{.command = prog, .trials_dir = dir + "/t", .objective = "score", .parallel = 2, .verbose = 0};
  run_command_trials(source, c);
  for (auto& t : oracle->trials()) {
    EXPECT_EQ(t.status, TrialStatus::kCompleted) << t.message;
    EXPECT_EQ(t.score.value_or(0), 2.0) << "trial " << t.trial_id << " never saw another trial running";
  }
  fs::remove_all(dir);
}

// --- the CLI: resume after kill -9, distributed ------------------------------------------------

struct Proc {
  pid_t pid = -1;
  std::string out;
};

Proc start_cli(const std::vector<std::string>& args, const std::string& out_path,
               const std::map<std::string, std::string>& env = {}) {
  const char* cli = std::getenv("KILN_CLI");
  std::vector<std::string> argv = {cli ? cli : ""};
  for (auto& a : args) argv.push_back(a);
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  std::fflush(stdout);  // else the child's freopen flushes our buffer a second time
  pid_t pid = fork();
  if (pid == 0) {
    for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    FILE* f = freopen(out_path.c_str(), "w", stdout);
    (void)f;
    dup2(1, 2);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  return {pid, out_path};
}

int wait_exit(pid_t pid, double seconds) {
  int status = 0;
  if (!wait_for([&] { return waitpid(pid, &status, WNOHANG) == pid; }, seconds)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<Trial> store_trials(const std::string& db) {
  if (!fs::exists(db)) return {};
  try {
    TrialStore s(db, true);
    return s.load_trials();
  } catch (const std::exception&) {
    return {};
  }
}

int count_status(const std::vector<Trial>& ts, TrialStatus s) {
  int n = 0;
  for (auto& t : ts) n += t.status == s;
  return n;
}

bool have_cli() {
  const char* cli = std::getenv("KILN_CLI");
  return cli && fs::exists(cli);
}

TEST(TuneCli, ResumeAfterKill9KeepsCompletedTrialsAndFinishesTheBudget) {
  if (!have_cli()) GTEST_SKIP() << "KILN_CLI is not set (ctest sets it to the kiln binary)";
  std::string dir = temp_dir("resume");
  std::string prog = write_script(dir, "prog.sh", kProgram);
  Json spec = {{"project_name", "p"},
               {"directory", dir},
               {"tuner", "random_search"},
               {"objective", {{"name", "score"}, {"direction", "max"}}},
               {"max_trials", 6},
               {"seed", 3},
               {"hyperparameters", space_x()},
               {"command", prog + " --steps=2 --pause=0.25"}};
  std::ofstream(dir + "/spec.json") << spec.dump();
  std::string db = dir + "/p/trials.db";
  Proc p = start_cli({"tune", dir + "/spec.json"}, dir + "/run1.log", {{"DONE_FILE", dir + "/done"}});
  ASSERT_TRUE(wait_for([&] { return count_status(store_trials(db), TrialStatus::kCompleted) >= 1; }, 30))
      << slurp(p.out);
  kill(p.pid, SIGKILL);
  waitpid(p.pid, nullptr, 0);
  auto before = store_trials(db);
  std::map<std::string, double> completed_before;
  for (auto& t : before)
    if (t.status == TrialStatus::kCompleted) completed_before[t.trial_id] = *t.score;
  ASSERT_LT(completed_before.size(), 6u) << "the search ended before the kill; slow the program down";

  // Without --resume the project is refused (one line, exit 2).
  Proc refused = start_cli({"tune", dir + "/spec.json"}, dir + "/refused.log");
  EXPECT_EQ(wait_exit(refused.pid, 30), 2);
  EXPECT_NE(slurp(refused.out).find("--resume"), std::string::npos) << slurp(refused.out);

  Proc r = start_cli({"tune", dir + "/spec.json", "--resume"}, dir + "/run2.log", {{"DONE_FILE", dir + "/done"}});
  ASSERT_EQ(wait_exit(r.pid, 60), 0) << slurp(r.out);
  auto after = store_trials(db);
  EXPECT_EQ(after.size(), 6u);
  EXPECT_EQ(count_status(after, TrialStatus::kCompleted), 6);
  std::set<std::string> ids;
  for (auto& t : after) {
    ids.insert(t.trial_id);
    if (completed_before.count(t.trial_id)) {
      EXPECT_DOUBLE_EQ(*t.score, completed_before[t.trial_id]);
    }
  }
  EXPECT_EQ(ids.size(), 6u);
  // Every trial's program ran to its end; completed ones were not rerun.
  std::map<std::string, int> runs;
  std::istringstream done(slurp(dir + "/done"));
  for (std::string id; done >> id;) ++runs[id];
  EXPECT_EQ(runs.size(), 6u);
  for (auto& [id, score] : completed_before) EXPECT_EQ(runs[id], 1) << "completed trial " << id << " ran again";
  // One HParams experiment in the log root, written by the first run, not again on resume.
  int experiments = 0;
  for (auto& ev : read_events(dir + "/p/logs"))
    for (auto& v : ev.summary().value()) experiments += v.tag() == "_hparams_/experiment";
  EXPECT_EQ(experiments, 1);

  Proc s = start_cli({"tune", "--summary", dir + "/p"}, dir + "/summary.log");
  EXPECT_EQ(wait_exit(s.pid, 30), 0);
  EXPECT_NE(slurp(s.out).find("COMPLETED=6"), std::string::npos) << slurp(s.out);
  // Per-trial histories out of the store: one JSON line per trial, one CSV row per step and metric.
  for (std::string ext : {"jsonl", "csv"}) {
    Proc e = start_cli({"tune", "--summary", dir + "/p", "--export", dir + "/history." + ext}, dir + "/export.log");
    ASSERT_EQ(wait_exit(e.pid, 30), 0) << slurp(e.out);
    std::istringstream lines(slurp(dir + "/history." + ext));
    std::vector<std::string> rows;
    for (std::string line; std::getline(lines, line);) rows.push_back(line);
    if (ext == "jsonl") {
      ASSERT_EQ(rows.size(), 6u);
      Json first = Json::parse(rows[0]);
      EXPECT_TRUE(first["hyperparameters"].contains("x")) << rows[0];
      EXPECT_EQ(first["metrics"]["score"].size(), 2u) << rows[0];
    } else {
      ASSERT_EQ(rows.size(), 1u + 6 * 2);  // header, 2 steps of "score" per trial
      EXPECT_EQ(rows[0], "trial_id,status,step,metric,value");
    }
  }
  Proc bad = start_cli({"tune", "--summary", dir + "/p", "--export", dir + "/history.txt"}, dir + "/bad.log");
  EXPECT_EQ(wait_exit(bad.pid, 30), 2);
  fs::remove_all(dir);
}

TEST(TuneCli, DistributedChiefAndTwoWorkersSurviveAWorkerKilledMidTrial) {
  if (!have_cli()) GTEST_SKIP() << "KILN_CLI is not set (ctest sets it to the kiln binary)";
  std::string dir = temp_dir("dist");
  std::string prog = write_script(dir, "prog.sh", kProgram);
  Json spec = {{"project_name", "p"},
               {"directory", dir},
               {"tuner", "random_search"},
               {"objective", {{"name", "score"}, {"direction", "max"}}},
               {"max_trials", 5},
               {"seed", 5},
               {"hyperparameters", space_x()},
               {"lease_seconds", 3.0},
               {"command", prog + " --steps=3 --pause=0.5"}};
  std::ofstream(dir + "/spec.json") << spec.dump();
  Proc chief = start_cli({"tune", dir + "/spec.json", "--chief", "--address", "127.0.0.1:0"}, dir + "/chief.log");
  int port = 0;
  ASSERT_TRUE(wait_for(
      [&] {
        std::string s = slurp(chief.out);
        auto at = s.find("listening on port ");
        if (at == std::string::npos) return false;
        port = std::atoi(s.c_str() + at + 18);
        return port > 0;
      },
      30))
      << slurp(chief.out);
  std::map<std::string, std::string> env = {{"DONE_FILE", dir + "/done"},
                                            {"KERASTUNER_ORACLE_IP", "127.0.0.1"},
                                            {"KERASTUNER_ORACLE_PORT", std::to_string(port)}};
  env["KERASTUNER_TUNER_ID"] = "wA";
  Proc a = start_cli({"tune", dir + "/spec.json"}, dir + "/wA.log", env);  // worker via KerasTuner's variables
  env["KERASTUNER_TUNER_ID"] = "wB";
  Proc b = start_cli({"tune", dir + "/spec.json"}, dir + "/wB.log", env);
  // Kill worker A while one of its trials is mid-run: exactly one of its 3
  // steps reported, so at least 2 pauses of 0.5 s remain before it could
  // finish. (Killing it after its program finished but before the chief
  // heard of it would rightly run that trial again: at-least-once.)
  auto metric_lines = [](const std::string& text) {
    size_t n = 0;
    for (size_t at = text.find("kiln-metric"); at != std::string::npos; at = text.find("kiln-metric", at + 1)) ++n;
    return n;
  };
  std::string killed_trial;
  ASSERT_TRUE(wait_for(
      [&] {
        if (!fs::exists(dir + "/p/wA")) return false;
        for (auto& e : fs::directory_iterator(dir + "/p/wA"))
          if (e.path().filename().string().rfind("trial_", 0) == 0 &&
              metric_lines(slurp(e.path().string() + "/stdout.log")) == 1 &&
              slurp(e.path().string() + "/stderr.log").find(" after ") == std::string::npos) {
            killed_trial = e.path().filename().string().substr(6);
            return true;
          }
        return false;
      },
      30))
      << slurp(a.out);
  kill(a.pid, SIGKILL);
  waitpid(a.pid, nullptr, 0);
  EXPECT_EQ(wait_exit(b.pid, 60), 0) << slurp(b.out);
  EXPECT_EQ(wait_exit(chief.pid, 30), 0) << slurp(chief.out);
  auto trials = store_trials(dir + "/p/trials.db");
  EXPECT_EQ(trials.size(), 5u);
  EXPECT_EQ(count_status(trials, TrialStatus::kCompleted), 5);
  EXPECT_TRUE(fs::exists(dir + "/p/wB/trial_" + killed_trial)) << "trial " << killed_trial << " was not retried on wB";
  EXPECT_NE(slurp(chief.out).find("lease expired"), std::string::npos) << slurp(chief.out);
  std::map<std::string, int> runs;
  std::istringstream done(slurp(dir + "/done"));
  for (std::string id; done >> id;) ++runs[id];
  EXPECT_EQ(runs.size(), 5u);
  for (auto& [id, n] : runs) EXPECT_EQ(n, 1) << "trial " << id << " ran to completion " << n << " times";
  fs::remove_all(dir);
}

// `kiln tune` over a kiln train spec: placeholders take each trial's values,
// and Hyperband's promoted trials continue from their parent's best epoch.
TEST(TuneCli, TrainSpecTrialsAndHyperbandPromotionsContinueFromTheParent) {
  if (!have_cli()) GTEST_SKIP() << "KILN_CLI is not set (ctest sets it to the kiln binary)";
  std::string dir = temp_dir("train");
  {
    std::mt19937_64 rng(5);
    std::normal_distribution<double> noise(0.0, 0.4);
    std::ofstream csv(dir + "/points.csv");
    csv << "f0,f1,f2,label\n";
    for (int i = 0; i < 240; ++i) {
      int c = i % 3;
      for (int k = 0; k < 3; ++k) csv << (k == c ? 1.5 : 0.0) + noise(rng) << (k < 2 ? "," : "");
      csv << "," << c << "\n";
    }
  }
  Json train = Json::parse(R"({
    "model": {"layers": [{"class_name": "Dense", "config": {"units": {"hp": "units"}, "activation": "relu"}},
                         {"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]},
    "data": {"source": "csv", "label": "label"},
    "compile": {"optimizer": {"class_name": "Adam", "config": {"learning_rate": {"hp": "lr"}}},
                "loss": "sparse_categorical_crossentropy", "metrics": ["accuracy"]},
    "fit": {"epochs": 1, "batch_size": 32, "validation_split": 0.25, "seed": 1, "verbose": 0}})");
  train["data"]["path"] = dir + "/points.csv";
  Json spec = {{"project_name", "p"},
               {"directory", dir},
               {"tuner", {{"type", "hyperband"}, {"max_epochs", 3}, {"factor", 3}}},
               {"objective", "val_accuracy"},
               {"seed", 2},
               {"tensorboard", false},
               {"hyperparameters", Json::parse(R"([
                 {"type": "Int", "name": "units", "min_value": 4, "max_value": 16, "step": 4},
                 {"type": "Float", "name": "lr", "min_value": 0.01, "max_value": 0.1, "sampling": "log"}])")},
               {"train", train}};
  std::ofstream(dir + "/spec.json") << spec.dump();
  Proc p = start_cli({"--threads", "1", "tune", dir + "/spec.json"}, dir + "/run.log");
  ASSERT_EQ(wait_exit(p.pid, 120), 0) << slurp(p.out);
  auto trials = store_trials(dir + "/p/trials.db");
  ASSERT_GE(trials.size(), 4u);
  int promoted = 0;
  for (auto& t : trials) {
    EXPECT_EQ(t.status, TrialStatus::kCompleted) << t.trial_id << ": " << t.message;
    ASSERT_TRUE(t.score) << t.trial_id;
    EXPECT_GT(*t.score, 0.5) << "trial " << t.trial_id << " did not learn the separable problem";
    const std::string tdir = dir + "/p/trial_" + t.trial_id;
    EXPECT_TRUE(fs::exists(tdir + "/best/model.json")) << tdir;
    std::string log = slurp(tdir + "/stdout.log");
    int64_t initial = t.hyperparameters.get_int("tuner/initial_epoch");
    // Its first report is the epoch it started at: 0, or where the parent stopped.
    auto first = log.find("kiln-metric");
    ASSERT_NE(first, std::string::npos) << log;
    std::string line = log.substr(first, log.find('\n', first) - first);
    EXPECT_NE(line.find(" step=" + std::to_string(initial)), std::string::npos) << line;
    if (t.hyperparameters.contains("tuner/trial_id")) {
      ++promoted;
      EXPECT_GT(initial, 0);
      EXPECT_NE(log.find("Continuing from " + dir + "/p/trial_" + t.hyperparameters.get_string("tuner/trial_id") +
                         "/best at epoch " + std::to_string(initial)),
                std::string::npos)
          << log;
    }
  }
  EXPECT_GE(promoted, 1);

  // keep_checkpoints: only the best trial keeps its best/ directory.
  spec["tuner"] = "random_search";
  spec["max_trials"] = 4;
  spec["keep_checkpoints"] = 1;
  spec["train"]["fit"]["epochs"] = 2;
  std::ofstream(dir + "/spec.json") << spec.dump();
  Proc k = start_cli({"--threads", "1", "tune", dir + "/spec.json", "--overwrite"}, dir + "/keep.log");
  ASSERT_EQ(wait_exit(k.pid, 120), 0) << slurp(k.out);
  auto kept = store_trials(dir + "/p/trials.db");
  ASSERT_EQ(kept.size(), 4u);
  const Trial* best = nullptr;
  for (auto& t : kept)
    if (t.score && (!best || *t.score > *best->score)) best = &t;
  ASSERT_NE(best, nullptr);
  int with_checkpoint = 0;
  for (auto& t : kept) {
    bool has = fs::exists(dir + "/p/trial_" + t.trial_id + "/best/model.json");
    with_checkpoint += has;
    if (has) {
      EXPECT_DOUBLE_EQ(*t.score, *best->score) << "trial " << t.trial_id << " kept a checkpoint";
    }
  }
  EXPECT_EQ(with_checkpoint, 1);
  fs::remove_all(dir);
}

TEST(TuneSpec, RejectsUnknownKeysAndBadTrainSpecs) {
  expect_error<ValueError>([] { TuneSpec::from_json({{"max_trail", 3}}); }, {"unknown key `max_trail`"});
  expect_error<ValueError>([] { TuneSpec::from_json({{"model", Json::object()}}); }, {"`model`", "inside `train`"});
  expect_error<ValueError>(
      [] {
        TuneSpec::from_json({{"hyperparameters", space_x()}, {"command", "x"}, {"train", Json::object()}});
      },
      {"either `command`", "or `train`"});
  expect_error<ValueError>(
      [] {
        TuneSpec::from_json({{"hyperparameters", space_x()},
                             {"train", {{"model", {{"builtin", "mlp"}, {"args", {{"dropout", {{"hp", "rate"}}}}}}}}}});
      },
      {"{\"hp\": \"rate\"}", "declares no such name"});
  // Placeholders are replaced by the trial's values, else their default.
  Json train = {{"a", {{"hp", "x"}}}, {"b", {1, {{"hp", "y"}, {"default", 0.5}}}}, {"c", {{"hp", 3}}}};
  EXPECT_EQ(substitute_hyperparameters(train, {{"x", 4}}), Json({{"a", 4}, {"b", {1, 0.5}}, {"c", {{"hp", 3}}}}));
  expect_error<ValueError>([&] { substitute_hyperparameters(train, {}); }, {"\"x\"", "default"});
  expect_error<ValueError>(
      [] {
        TuneSpec::from_json({{"parallel", 0}, {"hyperparameters", space_x()}});
      },
      {"`parallel`", "Received: 0"});
  expect_error<ValueError>([] { TuneSpec::from_json({{"hyperparameters", Json::array()}}); }, {"empty"});
  auto s = TuneSpec::from_json({{"hyperparameters", space_x()}, {"tuner", {{"type", "hyperband"}, {"max_epochs", 9}}}});
  EXPECT_EQ(s.tuner, "hyperband");
  EXPECT_EQ(s.make_oracle()->kind(), "Hyperband");
}

TEST(OracleChief, WorkerConfigFromKerasTunerEnvironment) {
  ::unsetenv("KERASTUNER_ORACLE_IP");
  EXPECT_FALSE(worker_config_from_env());
  ::setenv("KERASTUNER_ORACLE_IP", "10.0.0.2", 1);
  ::setenv("KERASTUNER_ORACLE_PORT", "8000", 1);
  ::setenv("KERASTUNER_TUNER_ID", "tuner7", 1);
  auto c = worker_config_from_env();
  ASSERT_TRUE(c);
  EXPECT_EQ(c->target(), "10.0.0.2:8000");
  EXPECT_EQ(c->tuner_id, "tuner7");
  ::setenv("KERASTUNER_ORACLE_PORT", "eighty", 1);
  expect_error<ValueError>([] { worker_config_from_env(); }, {"KERASTUNER_ORACLE_PORT", "eighty"});
  ::unsetenv("KERASTUNER_ORACLE_IP");
  ::unsetenv("KERASTUNER_ORACLE_PORT");
  ::unsetenv("KERASTUNER_TUNER_ID");
}

TEST(OracleChief, LeasesRefuseAStaleWorkerAndRequeueItsTrial) {
  auto oracle = random_oracle(1);
  OracleChief chief(oracle, {.address = "127.0.0.1:0", .lease_seconds = 0.5});
  RemoteOracleSource w1("127.0.0.1:" + std::to_string(chief.port()), "w1");
  RemoteOracleSource w2("127.0.0.1:" + std::to_string(chief.port()), "w2");
  Next next;
  auto t = w1.next_trial("w1", &next);
  ASSERT_TRUE(t);
  EXPECT_EQ(w1.report(t->trial_id, {{"score", 1.0}}, 0), TrialStatus::kRunning);
  EXPECT_FALSE(w2.next_trial("w2", &next));
  EXPECT_EQ(next, Next::kIdle);  // the budget is spent but a trial still runs
  // w1 goes silent: its lease expires and w2 gets the same trial.
  std::optional<Trial> again;
  ASSERT_TRUE(wait_for([&] { return (again = w2.next_trial("w2", &next)).has_value(); }, 10));
  EXPECT_EQ(again->trial_id, t->trial_id);
  EXPECT_TRUE(again->metrics.empty());
  expect_error<StateError>([&] { w1.report(t->trial_id, {{"score", 2.0}}, 1); }, {"does not hold trial"});
  expect_error<StateError>([&] { w1.end(t->trial_id, TrialStatus::kCompleted, ""); }, {"does not hold trial"});
  w2.report(again->trial_id, {{"score", 3.0}}, 0);
  w2.end(again->trial_id, TrialStatus::kCompleted, "");
  EXPECT_FALSE(w2.next_trial("w2", &next));
  EXPECT_EQ(next, Next::kDone);
  EXPECT_TRUE(chief.done());
  EXPECT_EQ(oracle->get_trial(t->trial_id).score.value_or(0), 3.0);
}

}  // namespace
}  // namespace kiln::tuning
