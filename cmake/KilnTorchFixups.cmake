# What building against a pip LibTorch (the `torch` wheel) or pytorch.org's
# LibTorch zip needs beyond find_package(Torch). Used by kiln's own build and
# by its installed package (kilnConfig.cmake), so a program built against an
# installed kiln gets the same fixes.

# The wheel's include folder also holds its own copies of third-party headers
# (google/protobuf 3.13, fmt 12, oneapi/dnnl 3.x). LibTorch's include folder is
# an -isystem path, searched before /usr/include, so those copies would shadow
# the headers of the libraries kiln links (the system's protobuf, fmt and
# oneDNN): protoc 3.21's generated code then fails to compile against protobuf
# 3.13's headers. GCC ignores an -I that names a system folder, so this makes a
# folder of symbolic links, one per such header tree of the system's, to put
# ahead of everything with -I. OUT_VAR receives the folder.
function(kiln_system_headers_first dir out_var)
  file(MAKE_DIRECTORY ${dir})
  set(trees "")
  # protobuf: the headers of the libprotobuf that FindProtobuf found.
  if(Protobuf_INCLUDE_DIR AND EXISTS ${Protobuf_INCLUDE_DIR}/google/protobuf)
    list(APPEND trees "${Protobuf_INCLUDE_DIR}/google")
  endif()
  # fmt (spdlog's, Debian's libfmt-dev) and oneDNN (Debian's libdnnl-dev):
  # only where the system has them; NO_CMAKE_PATH keeps LibTorch's copies out.
  find_path(KILN_SYSTEM_FMT_INCLUDE fmt/format.h NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH)
  if(KILN_SYSTEM_FMT_INCLUDE)
    list(APPEND trees "${KILN_SYSTEM_FMT_INCLUDE}/fmt")
  endif()
  find_path(KILN_SYSTEM_DNNL_INCLUDE oneapi/dnnl/dnnl.hpp NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH)
  if(KILN_SYSTEM_DNNL_INCLUDE)
    list(APPEND trees "${KILN_SYSTEM_DNNL_INCLUDE}/oneapi")
  endif()
  foreach(tree ${trees})
    get_filename_component(name ${tree} NAME)
    file(CREATE_LINK ${tree} ${dir}/${name} SYMBOLIC)
  endforeach()
  set(${out_var} ${dir} PARENT_SCOPE)
endfunction()

# The wheel's libtorch.so and libtorch_cpu.so export std::filesystem functions
# of their own, statically linked from another libstdc++ (PyTorch issue
# 133437); libtorch.so's remove_all jumps to address 0. A program resolves
# std::filesystem calls, its own and kiln's, to the first library in its
# lookup order that defines them. The compiler adds libstdc++ last (or, with
# some toolchains such as the GPU machine's /opt/gcc, links it statically and
# leaves it out of the program's dependencies altogether), so LibTorch came
# first and the first TempDir cleanup crashed. Naming the shared libstdc++ by
# its file name, first on the link line and whether or not it is "needed",
# makes it the first library in every kiln program's lookup order, so the
# standard library's definitions win. Exported to kiln's consumers with
# kiln::core. (kiln/core/toolchain_test.cc checks where the symbols resolve.)
set(KILN_LIBSTDCXX_FIRST "LINKER:--push-state,--no-as-needed,-l:libstdc++.so.6,--pop-state")
