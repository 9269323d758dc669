// SVG -> PNG through librsvg and cairo (Debian's librsvg2-dev). Compiled on
// its own (outside the unity batches and the precompiled header) since
// GLib's and cairo's include paths are given to this file only.
#include <string>

#include "kiln/core/error.h"
#include "kiln/plot/render.h"

#ifdef KILN_HAVE_RSVG
#include <cairo.h>
#include <librsvg/rsvg.h>

#include <memory>
#endif

namespace kiln::plot {

#ifdef KILN_HAVE_RSVG

namespace {

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

std::string take_message(GError* error) {
  std::string m = error && error->message ? error->message : "unknown error";
  if (error) g_error_free(error);
  return m;
}

}  // namespace

bool png_supported() { return true; }

std::string svg_to_png(const std::string& svg) {
  GError* error = nullptr;
  std::unique_ptr<RsvgHandle, decltype(&g_object_unref)> handle(
      rsvg_handle_new_from_data(reinterpret_cast<const guint8*>(svg.data()), svg.size(), &error), g_object_unref);
  if (!handle) throw FormatError("rendering the plot as PNG: librsvg refused the SVG: " + take_message(error));
  gdouble width = 0, height = 0;
  if (!rsvg_handle_get_intrinsic_size_in_pixels(handle.get(), &width, &height) || width < 1 || height < 1)
    throw FormatError("rendering the plot as PNG: the SVG has no size in pixels");
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface(
      cairo_image_surface_create(CAIRO_FORMAT_ARGB32, (int)width, (int)height), cairo_surface_destroy);
  std::unique_ptr<cairo_t, decltype(&cairo_destroy)> cr(cairo_create(surface.get()), cairo_destroy);
  cairo_set_source_rgb(cr.get(), 1, 1, 1);
  cairo_paint(cr.get());
  RsvgRectangle viewport{0, 0, width, height};
  if (!rsvg_handle_render_document(handle.get(), cr.get(), &viewport, &error))
    throw FormatError("rendering the plot as PNG: " + take_message(error));
  cairo_surface_flush(surface.get());
  std::string png;
  if (cairo_surface_write_to_png_stream(surface.get(), append_bytes, &png) != CAIRO_STATUS_SUCCESS)
    throw IOError("rendering the plot as PNG: cairo could not encode the image");
  return png;
}

#else

bool png_supported() { return false; }

std::string svg_to_png(const std::string&) {
  throw ValueError(
      "PNG output needs librsvg, which this kiln was built without (apt-get install librsvg2-dev, then "
      "rebuild); or write an .svg");
}

#endif

}  // namespace kiln::plot
