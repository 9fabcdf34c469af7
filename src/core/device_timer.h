#pragma once
// DeviceTimer: the time device work took, read on the device's own clock (CUDA events on the
// compute stream, as torch.cuda.Event(enable_timing=True)), without waiting for the device between
// marks. On a GPU the host returns from a kernel launch long before the kernel ends, so a host clock
// around an action measures its launches (the queueing), not its work; these marks measure the work.
namespace partrain {

class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  /// Marks the point of the compute stream after everything queued on it so far; returns the mark's
  /// index (0, 1, ... since the last reset). Does not wait for the device.
  virtual int mark() = 0;
  /// Seconds of device time between marks `first` and `second` (second after first); waits for the
  /// device to pass `second` (no wait after a synchronise). Throws partrain::Error for an unknown
  /// mark or a device error.
  virtual double seconds_between(int first, int second) = 0;
  /// Forgets every mark (their events are reused by the next ones).
  virtual void reset() = 0;
};

}  // namespace partrain
