// The picture of a search (`kiln tune --summary DIR --plot FILE.svg|png`):
// the objective of each trial in trial order with the best-so-far curve,
// then one panel per hyperparameter with the objective against its value
// (Int/Float on a linear axis spanning min_value..max_value, or a log axis
// when the space samples it "log"; Choice and Boolean as categories; Fixed
// ones are left out).
//
// Plotted trials: COMPLETED ones (filled points) and pruned STOPPED ones
// with a score (rings). FAILED, INVALID and RUNNING trials have no score;
// they are left out and counted in the subtitle. "Best so far" follows the
// objective's direction (min or max); the best trial is red in every
// hyperparameter panel.
#pragma once

#include <string>
#include <vector>

#include "kiln/plot/figure.h"
#include "kiln/tuning/trial.h"

namespace kiln::tuning {

// `space`: the hyperparameters to draw panels for (see above); those no
// trial has a value for get no panel.
plot::Figure tuning_figure(const std::vector<Trial>& trials, const Objective& objective,
                           const std::vector<HyperParameter>& space, const std::string& title);

// Reads <project_dir>/trials.db (read-only) and writes the figure to
// FILE.svg or FILE.png. ValueError naming the project and the fix when it
// holds no trials or none with a score (NotFoundError from
// project_store_path when it is not a tuning project).
void write_tuning_plot(const std::string& project_dir, const std::string& path);

}  // namespace kiln::tuning
