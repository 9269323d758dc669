#include "kiln/plot/history_plot.h"

#include <algorithm>

namespace kiln::plot {

Figure history_figure(const std::map<std::string, std::vector<double>>& history, const std::vector<int>& epochs,
                      const std::string& title) {
  std::vector<std::string> metrics;  // the base names, "loss" first
  for (const auto& [key, values] : history) {
    const std::string base = key.rfind("val_", 0) == 0 && key.size() > 4 ? key.substr(4) : key;
    if (base != key && history.count(base)) continue;  // drawn in base's panel
    if (std::find(metrics.begin(), metrics.end(), key) == metrics.end()) metrics.push_back(key);
  }
  std::stable_partition(metrics.begin(), metrics.end(), [](const std::string& m) { return m == "loss"; });

  Figure fig;
  fig.title = title;
  fig.columns = 2;
  size_t longest = 0;
  for (const auto& [key, values] : history) longest = std::max(longest, values.size());
  for (const std::string& m : metrics) {
    Panel& p = fig.panels.emplace_back();
    p.title = m;
    p.x_title = "epoch";
    p.y_title = m;
    p.integer_x = true;
    const bool with_validation = m.rfind("val_", 0) != 0 && history.count("val_" + m);
    for (const std::string& key : {m, std::string("val_") + m}) {
      auto it = history.find(key);
      if (it == history.end() || (key != m && !with_validation)) continue;
      Series s;
      s.name = key == m && m.rfind("val_", 0) != 0 ? "train" : "validation";
      s.dashed = s.name == "validation";
      s.color = palette_color(s.name == "train" ? 0 : 1);
      for (size_t i = 0; i < it->second.size(); ++i) {
        // validation_freq = k: one val_ entry per k epochs, after epochs k, 2k, ...
        const size_t stride = it->second.empty() ? 1 : std::max<size_t>(1, longest / it->second.size());
        const size_t e = (i + 1) * stride - 1;
        s.x.push_back((e < epochs.size() ? epochs[e] : (int)e) + 1.0);
        s.y.push_back(it->second[i]);
      }
      if (s.x.size() <= 40) s.marker = Marker::kCircle;  // a one-epoch run still shows its point
      p.series.push_back(std::move(s));
    }
  }
  return fig;
}

}  // namespace kiln::plot
