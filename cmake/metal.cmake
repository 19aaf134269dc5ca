# The Metal backend on Apple platforms (included by CMakeLists.txt there):
#   - the device, csrc/metal/apple_device.mm (Objective-C++ with ARC; the Metal and Foundation frameworks);
#   - the kernel sources embedded in the extension (cmake/metal_embed.py), compiled when the library loads
#     where no regolith.metallib was built;
#   - regolith.metallib: each metal/*.metal compiled to .air by `xcrun metal`, linked by `xcrun metallib`,
#     installed beside the extension, where the Metal toolchain works (probed here; Xcode 26 installs it
#     with `xcodebuild -downloadComponent MetalToolchain`). REGOLITH_METALLIB=OFF skips it.
enable_language(OBJCXX)
find_library(RG_METAL_FRAMEWORK Metal REQUIRED)
find_library(RG_FOUNDATION_FRAMEWORK Foundation REQUIRED)
set(RG_METAL_LINK ${RG_METAL_FRAMEWORK} ${RG_FOUNDATION_FRAMEWORK})

file(GLOB RG_METAL_KERNELS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/metal/*.metal)
file(GLOB RG_METAL_HEADERS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/metal/*.h)
set(RG_METAL_DEPS ${RG_METAL_KERNELS} ${RG_METAL_HEADERS} ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/quant.h
    ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/quant_tables.h)

set(RG_METAL_EMBEDDED ${CMAKE_CURRENT_BINARY_DIR}/metal_library_source.cpp)
add_custom_command(OUTPUT ${RG_METAL_EMBEDDED}
  COMMAND ${Python_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cmake/metal_embed.py ${RG_METAL_EMBEDDED}
  DEPENDS ${RG_METAL_DEPS} ${CMAKE_CURRENT_SOURCE_DIR}/cmake/metal_embed.py
  COMMENT "Embedding the Metal kernel sources" VERBATIM)
list(APPEND METAL_SOURCES csrc/metal/apple_device.mm ${RG_METAL_EMBEDDED})
set_source_files_properties(csrc/metal/apple_device.mm PROPERTIES COMPILE_OPTIONS "-fobjc-arc")

option(REGOLITH_METALLIB "Compile regolith.metallib with xcrun metal where the Metal toolchain works" ON)
if(REGOLITH_METALLIB)
  # Kernel compile flags: Metal 3.1 (macOS 14, M1 and newer), IEEE-conforming math (the conformance
  # tolerances assume it), no contraction of a * b + c (the dequantizers are bit-exact with the CPU's).
  set(RG_METAL_FLAGS -std=metal3.1 -fno-fast-math -ffp-contract=off -Wall -Wextra -Wno-unused-parameter
      -Wno-c++17-extensions -I${CMAKE_CURRENT_SOURCE_DIR}/csrc -I${CMAKE_CURRENT_SOURCE_DIR}/metal)
  if(CMAKE_OSX_DEPLOYMENT_TARGET)
    list(APPEND RG_METAL_FLAGS -mmacosx-version-min=${CMAKE_OSX_DEPLOYMENT_TARGET})
  endif()
  set(probe ${CMAKE_CURRENT_BINARY_DIR}/metal_probe)
  file(WRITE ${probe}.metal "kernel void rg_probe(device float* x [[buffer(0)]]) { x[0] = 1.0f; }\n")
  execute_process(COMMAND xcrun -sdk macosx metal ${RG_METAL_FLAGS} -c ${probe}.metal -o ${probe}.air
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE probe_error)
  if(rc EQUAL 0)
    set(airs "")
    foreach(kernel_file ${RG_METAL_KERNELS})
      get_filename_component(kernel_name ${kernel_file} NAME_WE)
      set(air ${CMAKE_CURRENT_BINARY_DIR}/metal_air/${kernel_name}.air)
      add_custom_command(OUTPUT ${air}
        COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/metal_air
        COMMAND xcrun -sdk macosx metal ${RG_METAL_FLAGS} -c ${kernel_file} -o ${air}
        DEPENDS ${kernel_file} ${RG_METAL_HEADERS} ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/quant.h
                ${CMAKE_CURRENT_SOURCE_DIR}/csrc/core/quant_tables.h
        COMMENT "Compiling metal/${kernel_name}.metal" VERBATIM)
      list(APPEND airs ${air})
    endforeach()
    set(RG_METALLIB ${CMAKE_CURRENT_BINARY_DIR}/regolith.metallib)
    add_custom_command(OUTPUT ${RG_METALLIB}
      COMMAND xcrun -sdk macosx metallib ${airs} -o ${RG_METALLIB}
      DEPENDS ${airs} COMMENT "Linking regolith.metallib" VERBATIM)
    add_custom_target(regolith_metallib ALL DEPENDS ${RG_METALLIB})
    install(FILES ${RG_METALLIB} DESTINATION regolith)
    message(STATUS "regolith: building regolith.metallib with xcrun metal")
  else()
    message(STATUS "regolith: the Metal toolchain does not work here (${probe_error}); the kernels are "
                   "compiled from the embedded sources when the library loads")
  endif()
endif()
