// The backends' constructors, for open_device/open_mapper (device_emulated.cpp). device_cuda.cpp
// defines the cuda ones when built with CUDA, device_nocuda.cpp otherwise.
#pragma once

#include <memory>

#include "tiers/hbm/device.hpp"

namespace cairn::hbm {

Result<std::unique_ptr<Device>> open_emulated_device(int ordinal);
std::unique_ptr<DeviceMapper> open_emulated_mapper();
Result<std::unique_ptr<Device>> open_cuda_device(int ordinal);
Result<std::unique_ptr<DeviceMapper>> open_cuda_mapper();

}  // namespace cairn::hbm
