# chunkwise_add_component(NAME DEFINE LIBS...): the INTERFACE target chunkwise::NAME (exported as NAME) that adds
# DEFINE=1 to its users and links LIBS. Each component installs into an export file of its own,
# chunkwise-NAME-targets.cmake, which the package config includes only when NAME is asked for (after finding NAME's
# dependency), so a consumer never needs the dependency of a component it does not use. NAME is appended to
# chunkwise_components in the caller's scope; chunkwise_cmake_dir is where the export files go.
function(chunkwise_add_component name define)
  add_library(chunkwise_${name} INTERFACE)
  add_library(chunkwise::${name} ALIAS chunkwise_${name})
  set_target_properties(chunkwise_${name} PROPERTIES EXPORT_NAME ${name})
  target_compile_definitions(chunkwise_${name} INTERFACE ${define}=1)
  target_link_libraries(chunkwise_${name} INTERFACE ${ARGN})
  install(TARGETS chunkwise_${name} EXPORT chunkwise-${name}-targets)
  install(EXPORT chunkwise-${name}-targets NAMESPACE chunkwise:: DESTINATION ${chunkwise_cmake_dir})
  set(chunkwise_components ${chunkwise_components} ${name} PARENT_SCOPE)
endfunction()
