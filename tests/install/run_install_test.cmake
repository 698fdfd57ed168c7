# Installs the build into a fresh prefix and builds and runs tests/install/consumer against it.
#   -DBUILD_DIR=<this build> -DCONSUMER=<consumer source> -DWORK=<scratch folder> -DGENERATOR=<generator>
#   -DCXX=<C++ compiler> -DCOMPONENTS=<a|b|c> -DEXPECT=<regex of the consumer's output>
#   -DHOST_ONLY=ON: the consumer is configured with CUDAToolkit and MPI made unfindable
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK}")
run(${CMAKE_COMMAND} --install "${BUILD_DIR}" --prefix "${WORK}/prefix")

# The package names no toolkit path: CUDA and NCCL are found again where the consumer has them.
file(GLOB _package_files "${WORK}/prefix/lib*/cmake/mladcp/*.cmake")
foreach(_f IN LISTS _package_files)
  file(STRINGS "${_f}" _hits REGEX "/usr/local/cuda|/cuda-[0-9]")
  if(_hits)
    message(FATAL_ERROR "${_f} hard-codes a CUDA toolkit path:\n${_hits}")
  endif()
endforeach()

string(REPLACE "|" "," _components "${COMPONENTS}")
set(_configure ${CMAKE_COMMAND} -S "${CONSUMER}" -B "${WORK}/build" -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}"
               "-DCMAKE_PREFIX_PATH=${WORK}/prefix" "-DMLADCP_COMPONENTS=${_components}")
if(HOST_ONLY)
  list(APPEND _configure -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON)
endif()
run(${_configure})
run(${CMAKE_COMMAND} --build "${WORK}/build")
run("${WORK}/build/consumer")
message("${last_output}")
if(NOT last_output MATCHES "${EXPECT}")
  message(FATAL_ERROR "the consumer's output does not match '${EXPECT}'")
endif()
