#pragma once
// Plans, the cost model, the layout candidates and the search (choose), dispatch and explain.
#include <chunkwise/plan/cost_model.hpp>
#include <chunkwise/plan/default_plans.hpp>
#include <chunkwise/plan/dispatch.hpp>
#include <chunkwise/plan/explain.hpp>
#include <chunkwise/plan/layout_candidates.hpp>
#include <chunkwise/plan/optimizer_execution.hpp>
#include <chunkwise/plan/plan.hpp>
#include <chunkwise/plan/prediction.hpp>
#include <chunkwise/plan/search.hpp>
