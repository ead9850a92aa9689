# FindCudnnFrontend: NVIDIA's cuDNN frontend (the header-only C++ graph API over cuDNN's backend)
# and cuDNN itself, which it calls. Used for the CUDA backend's fused attention
# (src/cuda/cudnn_attention.cpp). CMake ships no module for either.
#
# The frontend is not installed system-wide: scripts/common.sh (fetch_cudnn_frontend) unpacks the
# include/ folder of the pinned PyPI wheel nvidia-cudnn-frontend into the build tree
# (<build>/_deps/cudnn_frontend) and passes CUDNN_FRONTEND_ROOT; scripts/gpu_check.sh uses a copy
# carried to the GPU machine in .devdeps/cudnn_frontend.
# cuDNN: cudnn.h and libcudnn next to the CUDA toolkit (CUDAToolkit_INCLUDE_DIRS and
# CUDAToolkit_LIBRARY_DIR: call find_package(CUDAToolkit) first), or under CUDNN_ROOT (variable
# or environment), e.g. PyTorch's nvidia-cudnn package (site-packages/nvidia/cudnn/{include,lib},
# whose library is a bare libcudnn.so.9).
#
# Hints: CUDNN_FRONTEND_ROOT and CUDNN_ROOT (variables or environment), CMAKE_PREFIX_PATH.
# Result: CudnnFrontend_FOUND, CUDNN_FRONTEND_VERSION, CUDNN_FRONTEND_INCLUDE_DIR,
# CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION; target CudnnFrontend::CudnnFrontend (the
# frontend's headers, cuDNN's header and library, and the toolkit's NVRTC, which the frontend
# calls: call find_package(CUDAToolkit) first).
include(FindPackageHandleStandardArgs)

find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
  HINTS ${CUDNN_FRONTEND_ROOT} $ENV{CUDNN_FRONTEND_ROOT}
    ${CMAKE_BINARY_DIR}/_deps/cudnn_frontend ${PROJECT_SOURCE_DIR}/.devdeps/cudnn_frontend
  PATH_SUFFIXES include)
find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY
  NAMES cudnn libcudnn.so.9 NAMES_PER_DIR
  HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64)

# Versions: the frontend's from cudnn_frontend_version.h, cuDNN's from cudnn_version.h.
function(_cudnn_read_version file prefix out)
  if(EXISTS "${file}")
    file(STRINGS "${file}" _lines REGEX "^#define ${prefix}(MAJOR|MINOR|PATCH)[A-Z_]* +[0-9]+")
    foreach(_part MAJOR MINOR PATCH)
      string(REGEX MATCH "${prefix}${_part}[A-Z_]* +([0-9]+)" _ "${_lines}")
      set(_${_part} "${CMAKE_MATCH_1}")
    endforeach()
    set(${out} "${_MAJOR}.${_MINOR}.${_PATCH}" PARENT_SCOPE)
  endif()
endfunction()
if(CUDNN_FRONTEND_INCLUDE_DIR)
  _cudnn_read_version("${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend_version.h" "CUDNN_FRONTEND_"
    CUDNN_FRONTEND_VERSION)
endif()
if(CUDNN_INCLUDE_DIR)
  _cudnn_read_version("${CUDNN_INCLUDE_DIR}/cudnn_version.h" "CUDNN_" CUDNN_VERSION)
endif()

find_package_handle_standard_args(CudnnFrontend
  REQUIRED_VARS CUDNN_FRONTEND_INCLUDE_DIR CUDNN_INCLUDE_DIR CUDNN_LIBRARY
  VERSION_VAR CUDNN_FRONTEND_VERSION)

if(CudnnFrontend_FOUND AND NOT TARGET CudnnFrontend::CudnnFrontend)
  add_library(CudnnFrontend::CudnnFrontend INTERFACE IMPORTED)
  set_target_properties(CudnnFrontend::CudnnFrontend PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_FRONTEND_INCLUDE_DIR};${CUDNN_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${CUDNN_LIBRARY}")
  # The frontend's own engines (experimental/, compiled in with every graph) call NVRTC.
  if(TARGET CUDA::nvrtc)
    set_property(TARGET CudnnFrontend::CudnnFrontend APPEND PROPERTY
      INTERFACE_LINK_LIBRARIES CUDA::nvrtc)
  endif()
endif()
mark_as_advanced(CUDNN_FRONTEND_INCLUDE_DIR CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
