#include "tools/lineage_picture.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#ifdef CAIRN_HAVE_GRAPHVIZ
#include <graphviz/cgraph.h>
#include <graphviz/gvc.h>
#endif

namespace cairn::tool {

bool graphviz_linked() {
#ifdef CAIRN_HAVE_GRAPHVIZ
  return true;
#else
  return false;
#endif
}

Status render_dot(const std::string& dot, const std::string& format, const std::string& path) {
  if (format != "svg" && format != "png")
    return invalid_argument("picture format '" + format + "': cairn draws svg or png");
#ifndef CAIRN_HAVE_GRAPHVIZ
  (void)dot;
  (void)path;
  return unavailable("this cairn tool was built without Graphviz (Debian: libgraphviz-dev); " +
                     std::string("print the tree with --dot and draw it with `dot -T") + format + "`");
#else
  // Graphviz reports errors through agerr, to stderr unless told otherwise: keep them for the status.
  agseterr(AGMAX);
  GVC_t* gvc = gvContext();
  if (gvc == nullptr)
    return unavailable("Graphviz: gvContext failed (are its plugins configured? run `dot -c` as root)");
  Agraph_t* g = agmemread(dot.c_str());
  if (g == nullptr) {
    const char* why = aglasterr();
    gvFreeContext(gvc);
    return invalid_argument(std::string("Graphviz could not read the tree: ") + (why ? why : "no detail"));
  }
  Status st;
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  if (gvLayout(gvc, g, "dot") != 0) {
    const char* why = aglasterr();
    st = invalid_argument(std::string("Graphviz could not lay out the tree: ") + (why ? why : "no detail"));
  } else {
    if (gvRenderFilename(gvc, g, format.c_str(), tmp.c_str()) != 0) {
      const char* why = aglasterr();
      st = io_error("Graphviz could not write " + format + " to '" + tmp + "': " + (why ? why : std::strerror(errno)));
    }
    gvFreeLayout(gvc, g);
  }
  agclose(g);
  gvFreeContext(gvc);
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    st = io_error("renaming '" + tmp + "' to '" + path + "': " + std::strerror(errno));
  if (!st.ok()) std::remove(tmp.c_str());
  return st;
#endif
}

}  // namespace cairn::tool
