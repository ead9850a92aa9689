# FindCudnnFrontend: NVIDIA's cuDNN frontend (the header-only C++ graph API over cuDNN's backend)
# and cuDNN itself, which it calls (FindCUDNN.cmake, beside this file). Used to build the CUDA
# backend's fused attention (src/cuda/cudnn_attention.cpp). CMake ships no module for either.
#
# The frontend is not installed system-wide: scripts/common.sh (fetch_cudnn_frontend) unpacks the
# include/ folder of the pinned PyPI wheel nvidia-cudnn-frontend into the build tree
# (<build>/_deps/cudnn_frontend) and passes CUDNN_FRONTEND_ROOT; scripts/gpu_check.sh uses a copy
# carried to the GPU machine (scripts/fetch_gpu_deps.sh). Only the build reads its headers: the
# library links CUDNN::cudnn alone, and an installed lockstep never looks for the frontend.
#
# Hints: CUDNN_FRONTEND_ROOT (variable or environment), and FindCUDNN.cmake's.
# Result: CudnnFrontend_FOUND, CUDNN_FRONTEND_VERSION, CUDNN_FRONTEND_INCLUDE_DIR, and
# FindCUDNN.cmake's; target CudnnFrontend::CudnnFrontend (the frontend's headers and
# CUDNN::cudnn).
include(FindPackageHandleStandardArgs)

find_package(CUDNN QUIET)
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
  HINTS ${CUDNN_FRONTEND_ROOT} $ENV{CUDNN_FRONTEND_ROOT}
    ${CMAKE_BINARY_DIR}/_deps/cudnn_frontend ${PROJECT_SOURCE_DIR}/.devdeps/cudnn_frontend
  PATH_SUFFIXES include)

if(CUDNN_FRONTEND_INCLUDE_DIR AND
    EXISTS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h")
  file(STRINGS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h" _frontend_lines
    REGEX "^#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX MATCH "CUDNN_FRONTEND_${_part}_VERSION +([0-9]+)" _ "${_frontend_lines}")
    set(_frontend_${_part} "${CMAKE_MATCH_1}")
  endforeach()
  set(CUDNN_FRONTEND_VERSION "${_frontend_MAJOR}.${_frontend_MINOR}.${_frontend_PATCH}")
  unset(_frontend_lines)
endif()

find_package_handle_standard_args(CudnnFrontend
  REQUIRED_VARS CUDNN_FRONTEND_INCLUDE_DIR CUDNN_INCLUDE_DIR CUDNN_LIBRARY
  VERSION_VAR CUDNN_FRONTEND_VERSION)

if(CudnnFrontend_FOUND AND NOT TARGET CudnnFrontend::CudnnFrontend)
  add_library(CudnnFrontend::CudnnFrontend INTERFACE IMPORTED)
  set_target_properties(CudnnFrontend::CudnnFrontend PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES CUDNN::cudnn)
endif()
mark_as_advanced(CUDNN_FRONTEND_INCLUDE_DIR)
