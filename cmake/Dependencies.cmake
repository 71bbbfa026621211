# Every dependency comes from Debian 12's packages except CUDA and NCCL, which are optional.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(GTest REQUIRED)
find_package(benchmark REQUIRED)
find_package(spdlog REQUIRED)
# The CLI links OpenSSL, yaml-cpp (and libstdc++, cli/CMakeLists.txt) from their static
# archives (Debian's -dev packages ship them): a command then resolves none of their
# thousands of symbols and relocations at start, which was most of a `corral submit`'s CPU
# (docs/performance.md). The daemons and tests keep the shared libraries, so a security
# update of libssl3 or libyaml-cpp reaches the long-running, network-facing processes
# without a rebuild. A target asks for the archives with the property
# CORRAL_STATIC_DEPS; off in sanitizer and fuzz builds, whose runtimes interpose on the
# shared ones.
option(CORRAL_STATIC_DEPS "Link OpenSSL, yaml-cpp and libstdc++ statically into the CLI" ON)
if(CORRAL_SANITIZE OR CORRAL_FUZZ)
  set(CORRAL_STATIC_DEPS OFF)
endif()
find_package(OpenSSL REQUIRED)
if(CORRAL_STATIC_DEPS)
  find_library(CORRAL_SSL_STATIC NAMES libssl.a)
  find_library(CORRAL_CRYPTO_STATIC NAMES libcrypto.a)
  find_library(CORRAL_YAML_CPP_STATIC NAMES libyaml-cpp.a)
  if(NOT (CORRAL_SSL_STATIC AND CORRAL_CRYPTO_STATIC AND CORRAL_YAML_CPP_STATIC))
    message(STATUS "corral: static libssl, libcrypto or libyaml-cpp not found: the CLI links them shared")
    set(CORRAL_STATIC_DEPS OFF)
  endif()
endif()
# corral_openssl and corral_yaml_cpp: what corral's libraries link. Evaluated for the
# program being linked: the archives where it sets CORRAL_STATIC_DEPS, else the shared ones.
set(corral_static "$<AND:$<BOOL:${CORRAL_STATIC_DEPS}>,$<BOOL:$<TARGET_PROPERTY:CORRAL_STATIC_DEPS>>>")
add_library(corral_openssl INTERFACE)
target_link_libraries(corral_openssl INTERFACE
  "$<IF:${corral_static},${CORRAL_SSL_STATIC};${CORRAL_CRYPTO_STATIC};${CMAKE_DL_LIBS};Threads::Threads,OpenSSL::SSL;OpenSSL::Crypto>")
add_library(corral_yaml_cpp INTERFACE)
target_link_libraries(corral_yaml_cpp INTERFACE "$<IF:${corral_static},${CORRAL_YAML_CPP_STATIC},yaml-cpp>")
# yaml-cpp's headers, whichever library is linked.
get_target_property(corral_yaml_includes yaml-cpp INTERFACE_INCLUDE_DIRECTORIES)
if(corral_yaml_includes)
  target_include_directories(corral_yaml_cpp SYSTEM INTERFACE ${corral_yaml_includes})
endif()

# CUDA and NCCL: found under CUDA_HOME or /usr/local/cuda, the GPU code paths build.
set(CORRAL_CUDA_ROOT "$ENV{CUDA_HOME}")
if(NOT CORRAL_CUDA_ROOT)
  set(CORRAL_CUDA_ROOT /usr/local/cuda)
endif()
option(CORRAL_WITH_GPU "Build the CUDA/NCCL code paths when CUDA and NCCL are found" ON)
set(CORRAL_HAVE_GPU OFF)
if(CORRAL_WITH_GPU)
  find_path(CORRAL_CUDA_INCLUDE cuda_runtime_api.h HINTS ${CORRAL_CUDA_ROOT}/include NO_DEFAULT_PATH)
  find_path(CORRAL_NCCL_INCLUDE nccl.h HINTS ${CORRAL_CUDA_ROOT}/include /usr/include)
  find_library(CORRAL_CUDART_LIB cudart HINTS ${CORRAL_CUDA_ROOT}/lib64 ${CORRAL_CUDA_ROOT}/lib NO_DEFAULT_PATH)
  find_library(CORRAL_NCCL_LIB nccl HINTS ${CORRAL_CUDA_ROOT}/lib64 ${CORRAL_CUDA_ROOT}/lib /usr/lib/x86_64-linux-gnu)
  if(CORRAL_CUDA_INCLUDE AND CORRAL_NCCL_INCLUDE AND CORRAL_CUDART_LIB AND CORRAL_NCCL_LIB)
    set(CORRAL_HAVE_GPU ON)
    message(STATUS "corral: CUDA and NCCL found under ${CORRAL_CUDA_ROOT}: GPU code paths are built")
  else()
    message(STATUS "corral: CUDA or NCCL not found (looked under ${CORRAL_CUDA_ROOT}): GPU code paths are SKIPPED")
  endif()
else()
  message(STATUS "corral: CORRAL_WITH_GPU=OFF: GPU code paths are SKIPPED")
endif()
