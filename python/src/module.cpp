// The extension module mladcp._mladcp. The public Python API lives in python/mladcp/*.py; this module holds
// the calls into the C++ library, which take DLPack tensors without copying them.
#include "common.h"

NB_MODULE(_mladcp, m) {
  namespace nb = nanobind;
  m.doc() = "mladcp C++ core: MLA decode with LSE, merges, KV-cache writes, DCP (see the mladcp package)";
  m.attr("__version__") = MLADCP_VERSION_STRING;
  m.attr("cuda_built") = bool(MLADCP_PY_CUDA);
  m.attr("QK_DIM") = mladcp::kQkDim;
  m.attr("LATENT_DIM") = mladcp::kLatentDim;
  m.attr("ROPE_DIM") = mladcp::kRopeDim;
  m.attr("MAX_Q_LEN") = mladcp::kMaxQLen;
  // Shard objects live on in module-level caches and in torch's op registry until interpreter exit.
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const mladcp::py::UnsupportedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    }
  });
  mladcp::py::register_ops(m);
  mladcp::py::register_dcp(m);
}
