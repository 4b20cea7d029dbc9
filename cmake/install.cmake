# Install rules: the header, libxseg.a and libxseg.so, the CMake package
# (find_package(xseg CONFIG): xseg::xseg, xseg::xseg_static, xseg::xsim),
# pkg-config files (xseg.pc: libxseg.so with an rpath to it; xseg-static.pc:
# libxseg.a by path, as `pkg-config --static --libs xseg` cannot pick the
# archive over the .so; xseg-sim.pc) and the emulator as
# lib/xseg/libcuda.so.1 with include/xseg/xsim.h. The emulator lives in a
# folder of its own so that it never shadows a real libcuda.so.1; xseg finds
# it there relative to itself (vmm/driver_load.c).
include(CMakePackageConfigHelpers)

set(XSEG_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/xseg)

install(FILES include/xseg.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES sim/xsim.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/xseg)
install(TARGETS xseg xseg_shared EXPORT xsegTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS xsim EXPORT xsegTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/xseg)
install(EXPORT xsegTargets NAMESPACE xseg:: DESTINATION ${XSEG_CMAKE_DIR})

set(XSEG_CUDA_INCLUDE_DIRS ${CUDAToolkit_INCLUDE_DIRS})
configure_package_config_file(cmake/xsegConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/xsegConfig.cmake
  INSTALL_DESTINATION ${XSEG_CMAKE_DIR})
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/xsegConfigVersion.cmake
  COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/xsegConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/xsegConfigVersion.cmake
        DESTINATION ${XSEG_CMAKE_DIR})

# pkg-config: the prefix is found from the .pc file's own folder
# (${pcfiledir}), so `cmake --install --prefix P` and a moved prefix work.
file(RELATIVE_PATH XSEG_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" XSEG_PC_TO_PREFIX "${XSEG_PC_TO_PREFIX}")
set(XSEG_PC_LIBS_PRIVATE "-lpthread")
if(CMAKE_DL_LIBS)
  string(APPEND XSEG_PC_LIBS_PRIVATE " -l${CMAKE_DL_LIBS}")
endif()
string(JOIN " -I" XSEG_PC_CUDA_CFLAGS "" ${CUDAToolkit_INCLUDE_DIRS})
foreach(pc xseg xseg-static xseg-sim)
  configure_file(cmake/${pc}.pc.in ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${pc}.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

# The PyTorch modules: xseg_torch finds ../../libxseg.so.0 and
# ../../libxseg_torch.so.0 from here, and builds xseg_torch_oom.cc against
# the user's torch; its install() imports xseg_multiprocessing.
if(XSEG_BUILD_TORCH_ADAPTER)
  install(TARGETS xseg_torch LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(FILES python/xseg_torch.py python/xseg_torch_oom.cc
              python/xseg_multiprocessing.py python/xseg_fd_courier.py
              python/xseg_dlpack.py python/xseg_torch_oom.py
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/xseg/python)
