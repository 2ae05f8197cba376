#pragma once
// Plans, the cost model, the layout candidates and the search (choose), dispatch and explain. With the json component
// (CHUNKWISE_HAS_JSON, from chunkwise::json) also explain_json.
#include <chunkwise/plan/cost_model.hpp>
#include <chunkwise/plan/default_plans.hpp>
#include <chunkwise/plan/dispatch.hpp>
#include <chunkwise/plan/explain.hpp>
#if CHUNKWISE_HAS_JSON
#include <chunkwise/plan/explain_json.hpp>
#endif
#include <chunkwise/plan/layout_candidates.hpp>
#include <chunkwise/plan/optimizer_execution.hpp>
#include <chunkwise/plan/plan.hpp>
#include <chunkwise/plan/prediction.hpp>
#include <chunkwise/plan/search.hpp>
