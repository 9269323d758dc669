// The figure of a training history (Keras's History.history): one panel per
// metric, its training curve and, when the history has "val_<metric>", the
// validation curve, against the epoch.
//
//   History h = model->fit(...);
//   plot::write_figure(plot::history_figure(h.history, h.epoch, "mnist_mlp"), "history.svg");
//
// Panels: "loss" first, then the other metrics in name order (as `kiln train`
// prints them); a "val_x" without "x" gets a panel of its own. Epochs are
// numbered from 1 on the axis (Keras's `epoch` list counts from 0).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/plot/figure.h"

namespace kiln::plot {

// `epochs`: the 0-based epoch of each entry (empty: 0, 1, 2, ...).
Figure history_figure(const std::map<std::string, std::vector<double>>& history, const std::vector<int>& epochs,
                      const std::string& title);

}  // namespace kiln::plot
