#include "kiln/plot/render.h"

#include <algorithm>
#include <cctype>

#include "kiln/core/error.h"
#include "kiln/core/io.h"

namespace kiln::plot {

std::string plot_format(const std::string& path) {
  const size_t dot = path.rfind('.');
  const size_t slash = path.rfind('/');
  std::string ext = dot == std::string::npos || (slash != std::string::npos && dot < slash) ? "" : path.substr(dot + 1);
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  if (ext != "svg" && ext != "png")
    throw ValueError("--plot: name an .svg or .png file (the format follows the extension). Received: " + path);
  if (ext == "png" && !png_supported())
    throw ValueError(
        "--plot: PNG needs librsvg, which this kiln was built without (apt-get install librsvg2-dev, then rebuild); "
        "or write an .svg. Received: " +
        path);
  return ext;
}

void write_figure(const Figure& fig, const std::string& path) {
  const std::string format = plot_format(path);
  const std::string svg = to_svg(fig);
  atomic_write_file(path, format == "svg" ? svg : svg_to_png(svg));
}

}  // namespace kiln::plot
