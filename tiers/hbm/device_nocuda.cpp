// The CUDA backend's place in a build without the CUDA toolkit (CAIRN_WITH_CUDA=OFF): every entry
// says why it is unavailable. Built instead of device_cuda.cpp (CMakeLists.txt).
#include "tiers/hbm/device_internal.hpp"

namespace cairn::hbm {

namespace {
constexpr char kWhy[] =
    "this cairn was built without CUDA (CAIRN_WITH_CUDA=OFF: no CUDA toolkit found); rebuild with the toolkit, "
    "or set tiers.hbm.backend: emulated";
}

Result<std::unique_ptr<Device>> open_cuda_device(int) { return unavailable(kWhy); }
Result<std::unique_ptr<DeviceMapper>> open_cuda_mapper() { return unavailable(kWhy); }
bool cuda_compiled() { return false; }
int cuda_device_count(std::string* why) {
  if (why) *why = kWhy;
  return 0;
}

}  // namespace cairn::hbm
