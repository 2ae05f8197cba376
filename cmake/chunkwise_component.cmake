# chunkwise_add_component(NAME DEFINE LIBS...): the INTERFACE target chunkwise::NAME (exported as NAME) that adds
# DEFINE=1 to its users and links LIBS; appended to chunkwise_export_targets in the caller's scope.
function(chunkwise_add_component name define)
  add_library(chunkwise_${name} INTERFACE)
  add_library(chunkwise::${name} ALIAS chunkwise_${name})
  set_target_properties(chunkwise_${name} PROPERTIES EXPORT_NAME ${name})
  target_compile_definitions(chunkwise_${name} INTERFACE ${define}=1)
  target_link_libraries(chunkwise_${name} INTERFACE ${ARGN})
  set(chunkwise_export_targets ${chunkwise_export_targets} chunkwise_${name} PARENT_SCOPE)
endfunction()
