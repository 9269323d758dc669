// The picture of a search: tuning_figure on trials made here (direction,
// best so far, log and category panels, left-out trials), and
// `kiln tune --summary DIR --plot` on a small project run by the CLI.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "kiln/core/io.h"
#include "kiln/plot/render.h"
#include "kiln/testing/testing.h"
#include "kiln/testing/xml.h"
#include "kiln/tuning/trial_store.h"
#include "kiln/tuning/tuning_plot.h"

namespace kiln::tuning {
namespace {

HyperParameters space() {
  return HyperParameters::from_json(Json::parse(R"([
    {"type": "Float", "name": "lr", "min_value": 1e-4, "max_value": 1e-1, "sampling": "log"},
    {"type": "Int", "name": "units", "min_value": 8, "max_value": 64, "step": 8},
    {"type": "Choice", "name": "act", "values": ["relu", "tanh", "a<b&c"]},
    {"type": "Boolean", "name": "dropout"},
    {"type": "Fixed", "name": "epochs", "value": 3}
  ])"));
}

Trial trial(const std::string& id, double lr, int64_t units, const std::string& act, TrialStatus status,
            std::optional<double> score) {
  Trial t;
  t.trial_id = id;
  t.hyperparameters = space();
  t.hyperparameters.set("lr", lr);
  t.hyperparameters.set("units", units);
  t.hyperparameters.set("act", act);
  t.hyperparameters.set("dropout", units > 32);
  t.status = status;
  t.score = score;
  return t;
}

std::vector<Trial> search() {
  return {trial("00", 1e-3, 16, "relu", TrialStatus::kCompleted, 0.50),
          trial("01", 3e-2, 32, "tanh", TrialStatus::kCompleted, 0.70),
          trial("02", 2e-4, 64, "a<b&c", TrialStatus::kFailed, std::nullopt),
          trial("03", 5e-3, 48, "relu", TrialStatus::kStopped, 0.30),
          trial("04", 1e-2, 8, "tanh", TrialStatus::kCompleted, 0.40),
          trial("05", 1e-3, 16, "relu", TrialStatus::kRunning, std::nullopt)};
}

const plot::Series* named(const plot::Panel& p, const std::string& name) {
  for (auto& s : p.series)
    if (s.name == name) return &s;
  return nullptr;
}

TEST(TuningFigure, BestSoFarFollowsTheDirectionAndFailedTrialsAreLeftOutAndCounted) {
  const auto trials = search();
  plot::Figure max = tuning_figure(trials, Objective("val_accuracy"), space().space(), "t");
  // The history panel plus lr, units, act, dropout (Fixed has none).
  ASSERT_EQ(max.panels.size(), 5u);
  const plot::Panel& h = max.panels[0];
  ASSERT_NE(named(h, "best so far"), nullptr);
  // x is the trial's place from 0, as its id ("00", "01", ...).
  EXPECT_EQ(named(h, "completed")->x, (std::vector<double>{0, 1, 4}));
  EXPECT_EQ(named(h, "pruned")->x, (std::vector<double>{3}));
  EXPECT_EQ(named(h, "best so far")->y, (std::vector<double>{0.5, 0.7, 0.7, 0.7, 0.7}));  // ... to trial 05
  EXPECT_EQ(named(h, "best so far")->x.back(), 5);
  EXPECT_NE(max.subtitle.find("best 0.7 (trial 01)"), std::string::npos) << max.subtitle;
  EXPECT_NE(max.subtitle.find("FAILED=1 RUNNING=1"), std::string::npos) << max.subtitle;
  EXPECT_NE(h.y_title.find("(max)"), std::string::npos);

  plot::Figure min = tuning_figure(trials, Objective("val_loss"), space().space(), "t");
  EXPECT_EQ(named(min.panels[0], "best so far")->y, (std::vector<double>{0.5, 0.5, 0.3, 0.3, 0.3}));
  EXPECT_NE(min.subtitle.find("best 0.3 (trial 03)"), std::string::npos) << min.subtitle;

  // Panels: lr on a log axis, units linear, act and dropout as categories.
  EXPECT_EQ(max.panels[1].title, "lr");
  EXPECT_EQ(max.panels[1].x_scale, plot::Scale::kLog);
  EXPECT_EQ(max.panels[2].x_scale, plot::Scale::kLinear);
  EXPECT_EQ(max.panels[3].x_scale, plot::Scale::kCategory);
  EXPECT_EQ(max.panels[3].x_categories, (std::vector<std::string>{"relu", "tanh", "a<b&c"}));
  EXPECT_EQ(max.panels[4].x_categories, (std::vector<std::string>{"False", "True"}));
  // The best trial (01: tanh) is its own red point.
  EXPECT_EQ(named(max.panels[3], "best")->x, std::vector<double>{1});

  auto root = parse_xml(plot::to_svg(max));
  auto panels = root->find_all("g", "panel");
  ASSERT_EQ(panels.size(), 5u);
  // 4 scored trials: 4 points in every panel.
  for (auto* p : panels) {
    size_t points = p->find_all("circle", "marker").size();
    EXPECT_EQ(points, 4u);
  }
  std::vector<std::string> ticks;
  for (auto* t : panels[1]->find_all("text", "xtick")) ticks.push_back(t->text);
  EXPECT_EQ(ticks, (std::vector<std::string>{"0.0001", "0.001", "0.01", "0.1"}));
  ticks.clear();
  for (auto* t : panels[3]->find_all("text", "xtick")) ticks.push_back(t->text);
  EXPECT_EQ(ticks, (std::vector<std::string>{"relu", "tanh", "a<b&c"}));
}

std::string q(const std::string& s) { return "'" + s + "'"; }

// One line on stderr starting "kiln: error: " with every part, exit 2.
void expect_cli_error(const std::string& args, const std::vector<std::string>& parts) {
  auto r = run_command("( " + q(cli_path()) + " " + args + " 2>&1 1>/dev/null )");
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_EQ(r.output.rfind("kiln: error: ", 0), 0u) << r.output;
  for (auto& p : parts) EXPECT_NE(r.output.find(p), std::string::npos) << "'" << p << "' not in: " << r.output;
}

TEST(TuneCli, SummaryPlotDrawsASmallSearchAsSvgAndPng) {
  KILN_SKIP_WITHOUT_CLI();
  TempDir dir;
  // A trial program: score = (x - 3)^2 + 10 * lr, one report; act=bad fails.
  const std::string prog = dir.path() + "/prog.sh";
  std::ofstream(prog) << R"(#!/bin/sh
x=0; lr=0; act=relu
for a in "$@"; do case "$a" in --x=*) x="${a#--x=}";; --lr=*) lr="${a#--lr=}";; --act=*) act="${a#--act=}";; esac; done
[ "$act" = bad ] && exit 1
echo "kiln-metric score=$(awk -v x="$x" -v lr="$lr" 'BEGIN{print (x-3)*(x-3) + 10*lr}') step=0"
)";
  std::filesystem::permissions(prog, std::filesystem::perms::owner_all);
  Json spec = {{"project_name", "p"},
               {"directory", dir.path()},
               {"tuner", "random_search"},
               {"objective", {{"name", "score"}, {"direction", "min"}}},
               {"max_trials", 6},
               {"seed", 2},
               {"max_consecutive_failed_trials", 10},
               {"tensorboard", false},
               {"hyperparameters", Json::parse(R"([
                  {"type": "Int", "name": "x", "min_value": 0, "max_value": 8},
                  {"type": "Float", "name": "lr", "min_value": 1e-4, "max_value": 1e-1, "sampling": "log"},
                  {"type": "Choice", "name": "act", "values": ["relu", "tanh", "bad"]}])")},
               {"command", prog}};
  std::ofstream(dir.path() + "/spec.json") << spec.dump();
  auto run = run_command(q(cli_path()) + " tune " + q(dir.path() + "/spec.json") + " 2>&1");
  ASSERT_EQ(run.exit_code, 0) << run.output;

  const std::string project = dir.path() + "/p";
  auto svg = run_command(q(cli_path()) + " tune --summary " + q(project) + " --plot " + q(dir.path() + "/s.svg"));
  ASSERT_EQ(svg.exit_code, 0) << svg.output;
  EXPECT_NE(svg.output.find("Wrote " + dir.path() + "/s.svg"), std::string::npos) << svg.output;
  auto root = parse_xml(read_file(dir.path() + "/s.svg"));
  auto panels = root->find_all("g", "panel");
  ASSERT_EQ(panels.size(), 4u);  // objective per trial, x, lr, act
  TrialStore store(project + "/trials.db", true);
  size_t scored = 0;
  for (auto& t : store.load_trials()) scored += t.status == TrialStatus::kCompleted;
  ASSERT_GT(scored, 0u);
  EXPECT_EQ(panels[0]->find_all("circle", "marker").size(), scored);
  EXPECT_EQ(panels[0]->find_all("path", "line").size(), 1u);  // best so far
  std::vector<std::string> lr_ticks;
  for (auto* t : panels[2]->find_all("text", "xlabel")) lr_ticks.push_back(t->text);
  EXPECT_EQ(lr_ticks, std::vector<std::string>{"lr (log)"});

  if (plot::png_supported()) {
    auto png = run_command(q(cli_path()) + " tune --summary " + q(project) + " --plot " + q(dir.path() + "/s.png"));
    ASSERT_EQ(png.exit_code, 0) << png.output;
    EXPECT_EQ(read_file(dir.path() + "/s.png").substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  }
  // Bad input: one line, exit 2, the problem and the fix.
  expect_cli_error("tune --summary " + q(project) + " --plot " + q(dir.path() + "/s.pdf"), {".svg or .png", "s.pdf"});
  expect_cli_error("tune --summary " + q(dir.path()) + " --plot " + q(dir.path() + "/x.svg"),
                   {"not a tuning project", "trials.db"});
  make_dirs(dir.path() + "/empty");
  { TrialStore empty(dir.path() + "/empty/trials.db"); }
  expect_cli_error("tune --summary " + q(dir.path() + "/empty") + " --plot " + q(dir.path() + "/x.svg"),
                   {"no trials", "kiln tune SPEC.json"});
  EXPECT_FALSE(path_exists(dir.path() + "/x.svg"));
}

}  // namespace
}  // namespace kiln::tuning
