// Writing a Figure to a file: FILE.svg as the SVG document (figure.h), FILE.png
// as that same SVG rendered by librsvg, so both formats come from one
// drawing path.
//
//   plot::check_plot_path(path);     // before an hour of training: bad names fail now
//   ...
//   plot::write_figure(fig, path);   // atomic: the file is whole or absent
//
// PNG support is optional at build time (KILN_HAVE_RSVG, Debian's
// librsvg2-dev); without it a .png path is a ValueError that names the
// package. Thread-safe.
#pragma once

#include <string>

#include "kiln/plot/figure.h"

namespace kiln::plot {

// "svg" or "png" for a path ending in .svg / .png (any case); ValueError
// naming the path and the fix otherwise, and for .png in a build without
// librsvg.
std::string plot_format(const std::string& path);
inline void check_plot_path(const std::string& path) { (void)plot_format(path); }

// Whether this build renders PNG (librsvg).
bool png_supported();

// PNG bytes of an SVG document, rendered at its own width x height on white.
// FormatError if librsvg refuses the document.
std::string svg_to_png(const std::string& svg);

// Writes the figure as SVG or PNG by the path's extension.
void write_figure(const Figure& fig, const std::string& path);

}  // namespace kiln::plot
