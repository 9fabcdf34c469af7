// Reproducer of the heap corruption of issue 31 (validation/perf/README.md, "oneDNN convolutions and
// the heap corruption"): oneDNN 2.6.3's AVX2 sgemm kernel runs with its stack pointer in a heap
// workspace when a K block is longer than 252, so a signal handler's frame lands in the heap.
// Two threads call dnnl_sgemm('N', 'N', 64, 512, 256) in a loop while a third sends SIGUSR1 to the
// process every 100 us; a handler is installed (as partrain's stop handler). Not part of the build:
//   g++ -O2 -std=c++20 validation/perf/onednn_sgemm_signal_repro.cpp -o /tmp/repro -ldnnl -lpthread
//   OMP_NUM_THREADS=1 /tmp/repro        # handler on the interrupted stack: may abort (exit 134)
//   OMP_NUM_THREADS=1 /tmp/repro alt    # handler on an alternate stack (SA_ONSTACK): no abort seen
#include <oneapi/dnnl/dnnl.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <pthread.h>
#include <thread>
#include <atomic>
#include <vector>
#include <unistd.h>
volatile sig_atomic_t got = 0;
extern "C" void handler(int s) { got = s; }
std::atomic<bool> done{false};
int main(int argc, char** argv) {
  bool altstack = argc > 1 && argv[1][0] == 'a';
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  action.sa_flags = altstack ? SA_ONSTACK : 0;
  sigaction(SIGUSR1, &action, nullptr);
  std::vector<pthread_t> workers;
  const int m = 64, n = 512, k = 256;
  std::vector<float> a(m * k, 1.f), b(k * n, 1.f), c(m * n);
  auto work = [&] {
    if (altstack) { stack_t s{}; s.ss_sp = malloc(1 << 16); s.ss_size = 1 << 16; sigaltstack(&s, nullptr); }
    std::vector<float> cc(m * n);
    for (long i = 0; i < 200000 && !done; ++i) {
      std::vector<float> noise(37 + i % 100);  // keep the heap busy
      dnnl_sgemm('N', 'N', m, n, k, 1.f, a.data(), k, b.data(), n, 0.f, cc.data(), n);
    }
  };
  std::thread t1(work), t2(work);
  std::thread killer([&] { for (int i = 0; i < 100000 && !done; ++i) { kill(getpid(), SIGUSR1); usleep(100); } done = true; });
  t1.join(); t2.join(); done = true; killer.join();
  std::puts("finished without abort");
}
