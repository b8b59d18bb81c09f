# The CTest run of a fuzzer (cmake -P): copies the seed corpus CORPUS into a fresh WORK
# directory, runs FUZZER over it for a bounded number of inputs and time, and fails when the
# fuzzer reports a crash, a leak, a timeout or an out-of-memory (crash inputs land in WORK).
#   cmake -DFUZZER=bin -DCORPUS=dir -DWORK=dir [-DRUNS=20000] [-DSECONDS=30] -P run_fuzz.cmake
foreach(v FUZZER CORPUS WORK)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzz.cmake: ${v} is not set")
  endif()
endforeach()
if(NOT DEFINED RUNS)
  set(RUNS 20000)
endif()
if(NOT DEFINED SECONDS)
  set(SECONDS 30)
endif()

file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
file(GLOB seeds ${CORPUS}/*)
file(COPY ${seeds} DESTINATION ${WORK}/corpus)

execute_process(
  COMMAND ${FUZZER} -runs=${RUNS} -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048
          -malloc_limit_mb=256
          -print_final_stats=1 -artifact_prefix=${WORK}/artifacts/ ${WORK}/corpus
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "run_fuzz.cmake: ${FUZZER} exited with ${rc}; inputs in ${WORK}/artifacts")
endif()
