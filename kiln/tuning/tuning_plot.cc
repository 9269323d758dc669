#include "kiln/tuning/tuning_plot.h"

#include <algorithm>
#include <map>
#include <optional>

#include "kiln/core/error.h"
#include "kiln/plot/render.h"
#include "kiln/tuning/trial_store.h"
#include "kiln/tuning/tune_spec.h"

namespace kiln::tuning {
namespace {

const char* kBestColor = "#d62728";

bool plotted(const Trial& t) {
  return (t.status == TrialStatus::kCompleted || t.status == TrialStatus::kStopped) && t.score.has_value();
}

std::string direction_name(const Objective& o) { return o.direction() == Direction::kMax ? "max" : "min"; }

// The x coordinate of a value on the hyperparameter's panel; nullopt when it
// cannot be placed (a value outside the declared choices).
std::optional<double> x_of(const HyperParameter& hp, const Value& v, const std::vector<std::string>& categories) {
  if (hp.kind == HpKind::kInt || hp.kind == HpKind::kFloat) {
    if (auto i = std::get_if<int64_t>(&v)) return (double)*i;
    if (auto d = std::get_if<double>(&v)) return *d;
    return std::nullopt;
  }
  const std::string s = value_to_string(v);
  for (size_t i = 0; i < categories.size(); ++i)
    if (categories[i] == s) return (double)i;
  return std::nullopt;
}

std::vector<std::string> categories_of(const HyperParameter& hp) {
  if (hp.kind == HpKind::kBoolean) return {"False", "True"};
  std::vector<std::string> out;
  for (const Value& v : hp.values) out.push_back(value_to_string(v));
  return out;
}

}  // namespace

plot::Figure tuning_figure(const std::vector<Trial>& trials, const Objective& objective,
                           const std::vector<HyperParameter>& space, const std::string& title) {
  plot::Figure fig;
  fig.title = title;
  std::map<std::string, int> left_out;
  int scored = 0;
  const Trial* best = nullptr;
  for (const Trial& t : trials) {
    if (!plotted(t)) {
      ++left_out[status_name(t.status)];
      continue;
    }
    ++scored;
    if (!best || objective.better(*t.score, *best->score)) best = &t;
  }
  fig.subtitle = std::to_string(trials.size()) + " trials, " + std::to_string(scored) + " with a score";
  if (best) fig.subtitle += "; best " + plot::format_tick(*best->score) + " (trial " + best->trial_id + ")";
  if (!left_out.empty()) {
    fig.subtitle += "; not shown:";
    for (auto& [status, n] : left_out) fig.subtitle += " " + status + "=" + std::to_string(n);
  }
  const std::string y_title = objective.name() + " (" + direction_name(objective) + ")";
  const std::string completed_color = plot::palette_color(0), pruned_color = plot::palette_color(1);

  // The search in trial order.
  plot::Panel& history = fig.panels.emplace_back();
  history.title = "objective per trial";
  history.x_title = "trial";
  history.y_title = y_title;
  history.integer_x = true;
  plot::Series done{
      .name = "completed", .line = plot::Line::kNone, .marker = plot::Marker::kCircle, .color = completed_color};
  plot::Series pruned{
      .name = "pruned", .line = plot::Line::kNone, .marker = plot::Marker::kRing, .color = pruned_color};
  plot::Series best_so_far{.name = "best so far", .line = plot::Line::kStep, .color = kBestColor};
  std::optional<double> running_best;
  for (size_t i = 0; i < trials.size(); ++i) {
    const Trial& t = trials[i];
    if (!plotted(t)) continue;
    const double x = (double)i;  // trials are numbered from 0, as their ids (KerasTuner's "00", "01", ...)
    plot::Series& s = t.status == TrialStatus::kStopped ? pruned : done;
    s.x.push_back(x);
    s.y.push_back(*t.score);
    s.point_labels.push_back("trial " + t.trial_id + ": " + objective.name() + "=" + plot::format_tick(*t.score));
    if (!running_best || objective.better(*t.score, *running_best)) running_best = *t.score;
    best_so_far.x.push_back(x);
    best_so_far.y.push_back(*running_best);
  }
  if (!best_so_far.x.empty()) {  // the curve runs on to the last trial
    best_so_far.x.push_back((double)trials.size() - 1);
    best_so_far.y.push_back(*running_best);
  }
  history.series.push_back(std::move(best_so_far));
  history.series.push_back(std::move(done));
  if (!pruned.x.empty()) history.series.push_back(std::move(pruned));

  // One panel per hyperparameter.
  for (const HyperParameter& hp : space) {
    if (hp.kind == HpKind::kFixed) continue;
    plot::Panel p;
    p.title = hp.name;
    p.x_title =
        hp.name +
        (hp.sampling == Sampling::kLog && (hp.kind == HpKind::kInt || hp.kind == HpKind::kFloat) ? " (log)" : "");
    p.y_title = y_title;
    std::vector<std::string> categories;
    if (hp.kind == HpKind::kInt || hp.kind == HpKind::kFloat) {
      p.x_scale = hp.sampling == Sampling::kLog ? plot::Scale::kLog : plot::Scale::kLinear;
      p.x_include = {hp.min_value, hp.max_value};  // the whole range searched, not just what was tried
    } else {
      categories = categories_of(hp);
      p.x_scale = plot::Scale::kCategory;
      p.x_categories = categories;
    }
    plot::Series d{.line = plot::Line::kNone, .marker = plot::Marker::kCircle, .color = completed_color};
    plot::Series r{.line = plot::Line::kNone, .marker = plot::Marker::kRing, .color = pruned_color};
    plot::Series b{.name = "best", .line = plot::Line::kNone, .marker = plot::Marker::kCircle, .color = kBestColor};
    for (const Trial& t : trials) {
      if (!plotted(t) || !t.hyperparameters.contains(hp.name)) continue;
      const Value v = t.hyperparameters.get(hp.name);
      const std::optional<double> x = x_of(hp, v, categories);
      if (!x) continue;
      plot::Series& s = &t == best ? b : t.status == TrialStatus::kStopped ? r : d;
      s.x.push_back(*x);
      s.y.push_back(*t.score);
      s.point_labels.push_back("trial " + t.trial_id + ": " + hp.name + "=" + value_to_string(v) + ", " +
                               objective.name() + "=" + plot::format_tick(*t.score));
    }
    if (d.x.empty() && r.x.empty() && b.x.empty()) continue;  // no trial had it (an inactive branch)
    p.series.push_back(std::move(d));
    if (!r.x.empty()) p.series.push_back(std::move(r));
    p.series.push_back(std::move(b));
    fig.panels.push_back(std::move(p));
  }
  return fig;
}

void write_tuning_plot(const std::string& project_dir, const std::string& path) {
  plot::check_plot_path(path);
  TrialStore store(project_store_path(project_dir), /*read_only=*/true);
  const std::vector<Trial> trials = store.load_trials();
  if (trials.empty())
    throw ValueError("'" + project_dir +
                     "' holds no trials yet; nothing to plot. Run `kiln tune SPEC.json` first (or --resume it)");
  const std::optional<Json> spec = stored_tune_spec(store);
  const Objective objective =
      Objective::from_json(spec ? spec->value("objective", Json("val_loss")) : Json("val_loss"));
  // The space: the trials' own (the order they declared it), else the spec's.
  HyperParameters space;
  for (const Trial& t : trials) space.merge_space(t.hyperparameters);
  if (space.space().empty() && spec && spec->contains("hyperparameters"))
    space.merge_space(HyperParameters::from_json((*spec)["hyperparameters"]));
  if (std::none_of(trials.begin(), trials.end(), plotted))
    throw ValueError("none of the " + std::to_string(trials.size()) + " trials in '" + project_dir +
                     "' has a score for the objective `" + objective.name() +
                     "` yet; nothing to plot. See `kiln tune --summary " + project_dir +
                     "` and each trial_<id>/stderr.log");
  plot::write_figure(tuning_figure(trials, objective, space.space(), "kiln tune: " + project_dir), path);
}

}  // namespace kiln::tuning
