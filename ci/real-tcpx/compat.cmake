# Loaded into the plugin's CMake project (CMAKE_PROJECT_INCLUDE) by ci/real-tcpx/build.sh.
# The plugin links targets that newer abseil and protobuf releases export and Debian 12's do not:
# absl::log_internal_message and absl::log_internal_check_impl (abseil >= 20230125) and
# utf8_range/utf8_validity (protobuf >= 22). With the older releases their code lives elsewhere or
# is not needed, so each missing one becomes an empty interface target; the CHECK macros come from
# the shim header beside this file.
if(NOT EXISTS "${TCPX_DEPS_INCLUDE}/absl/log/check.h")
  foreach(t absl::log_internal_message absl::log_internal_check_impl)
    if(NOT TARGET ${t})
      add_library(${t} INTERFACE IMPORTED GLOBAL)
    endif()
  endforeach()
  include_directories(BEFORE SYSTEM "${CMAKE_CURRENT_LIST_DIR}/shim")
endif()
foreach(t utf8_range utf8_validity)
  if(NOT TARGET ${t} AND NOT EXISTS "${TCPX_DEPS_LIB}/lib${t}.a"
     AND NOT EXISTS "${TCPX_DEPS_LIB}/lib${t}.so")
    add_library(${t} INTERFACE IMPORTED GLOBAL)
  endif()
endforeach()
# The dependencies' headers for every target and language (nvcc compiles .cu files that include
# abseil headers, and not every target that does links an abseil target).
if(NOT "${TCPX_DEPS_INCLUDE}" STREQUAL "/usr/include")
  include_directories(AFTER SYSTEM "${TCPX_DEPS_INCLUDE}")
endif()
