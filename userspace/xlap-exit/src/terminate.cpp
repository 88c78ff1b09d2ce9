// An allocation that fails in the analyses' engine (DuckDB, C++) where the
// engine does not catch it ends in std::terminate: without this handler,
// an abort (exit 134) with libstdc++'s line about std::bad_alloc. With it,
// the same message and exit code as an allocation that fails in Rust
// (memory.rs). Nothing here allocates.
#include <cstdlib>
#include <cxxabi.h>
#include <exception>
#include <new>
#include <typeinfo>

extern "C" [[noreturn]] void xlap_exit_engine_out_of_memory(void);

namespace {
std::terminate_handler previous = nullptr;

void on_terminate() {
  const std::type_info *thrown = abi::__cxa_current_exception_type();
  if (thrown != nullptr && (*thrown == typeid(std::bad_alloc) ||
                            *thrown == typeid(std::bad_array_new_length))) {
    xlap_exit_engine_out_of_memory();
  }
  if (previous != nullptr) {
    previous();
  }
  std::abort();
}
} // namespace

extern "C" void xlap_exit_install_terminate(void) {
  std::terminate_handler old = std::set_terminate(on_terminate);
  if (old != on_terminate) {
    previous = old;
  }
}
