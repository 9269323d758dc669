#include "kiln/distribute/cluster.h"

#include <cstdlib>
#include <map>

#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/core/json_limits.h"

namespace kiln::distribute {
namespace {

std::optional<std::string> process_env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

int int_var(const std::string& name, const std::string& value, int lo, int hi) {
  size_t used = 0;
  long v = 0;
  try {
    v = std::stol(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < lo || v > hi)
    throw ValueError(name + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "]. Received: " + name + "=" + text_excerpt(value));
  return static_cast<int>(v);
}

// "host:port" -> (host, port).
std::pair<std::string, int> host_port(const std::string& entry, const std::string& where) {
  const auto colon = entry.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw ValueError("TF_CONFIG: " + where + " must be \"host:port\". Received: " + text_excerpt(entry));
  return {entry.substr(0, colon), int_var("TF_CONFIG " + where + " port", entry.substr(colon + 1), 1, 65535)};
}

ClusterSpec from_torchrun(const GetEnv& env) {
  ClusterSpec c;
  c.source = "torchrun";
  c.world_size = int_var("WORLD_SIZE", env("WORLD_SIZE").value_or("1"), 1, 1 << 20);
  c.rank = int_var("RANK", *env("RANK"), 0, c.world_size - 1);
  c.local_rank = int_var("LOCAL_RANK", env("LOCAL_RANK").value_or("0"), 0, c.world_size - 1);
  c.local_world_size = int_var("LOCAL_WORLD_SIZE", env("LOCAL_WORLD_SIZE").value_or("1"), 1, c.world_size);
  if (auto a = env("MASTER_ADDR")) c.master_addr = *a;
  if (auto p = env("MASTER_PORT")) c.master_port = int_var("MASTER_PORT", *p, 1, 65535);
  if (c.world_size > 1 && !env("MASTER_ADDR"))
    throw ValueError(
        "RANK and WORLD_SIZE are set but MASTER_ADDR is not; set MASTER_ADDR (and MASTER_PORT) to rank "
        "0's host, or start the job with `kiln launch`");
  return c;
}

Json parse_tf_config(const std::string& text) {
  Json cfg;
  try {
    cfg = parse_json(text, "TF_CONFIG");
  } catch (const std::exception& e) {
    throw ValueError(std::string(e.what()) + "; TF_CONFIG must be JSON (see docs/DISTRIBUTED.md)");
  }
  return cfg;
}

ClusterSpec from_tf_config(const std::string& text) {
  const Json cfg = parse_tf_config(text);
  if (!cfg.is_object() || !cfg.contains("cluster") || !cfg["cluster"].is_object() || !cfg.contains("task") ||
      !cfg["task"].is_object())
    throw ValueError(
        "TF_CONFIG must be an object with \"cluster\" and \"task\", e.g. {\"cluster\": {\"worker\": "
        "[\"host1:2222\", \"host2:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}");
  const Json& cluster = cfg["cluster"];
  for (auto& [k, v] : cluster.items()) {
    if (k == "ps")
      throw ValueError(
          "TF_CONFIG: cluster role 'ps' makes this a parameter-server job, and a ps task has no "
          "data-parallel rank; for data-parallel training list only \"chief\" and \"worker\" (parameter "
          "servers: resolve_ps_cluster, see docs/DISTRIBUTED.md)");
    // An evaluator (a TFJob's Evaluator replica) takes no part in training:
    // it is allowed in the cluster and gets no rank.
    if (k != "chief" && k != "worker" && k != "evaluator")
      throw ValueError("TF_CONFIG: cluster role " + text_excerpt(k) +
                       " is not supported by data-parallel training; use \"chief\" and \"worker\" (parameter "
                       "servers: see docs/DISTRIBUTED.md)");
    if (!v.is_array()) throw ValueError("TF_CONFIG: cluster." + k + " must be a list of \"host:port\"");
  }
  std::vector<std::pair<std::string, std::string>> tasks;  // (type, "host:port") in rank order
  for (const char* role : {"chief", "worker"})
    if (cluster.contains(role))
      for (auto& e : cluster[role]) {
        if (!e.is_string()) throw ValueError(std::string("TF_CONFIG: cluster.") + role + " entries must be strings");
        tasks.emplace_back(role, e.get<std::string>());
      }
  if (tasks.empty()) throw ValueError("TF_CONFIG: the cluster lists no chief and no worker");
  if (cluster.contains("chief") && cluster["chief"].size() != 1)
    throw ValueError("TF_CONFIG: cluster.chief must list exactly one task");
  const Json& task = cfg["task"];
  if (!task.contains("type") || !task["type"].is_string() || !task.contains("index") ||
      !task["index"].is_number_integer())
    throw ValueError("TF_CONFIG: task must be {\"type\": \"chief\"|\"worker\", \"index\": N}");
  const std::string type = task["type"].get<std::string>();
  const long index = task["index"].get<long>();
  if (type == "evaluator")
    throw ValueError(
        "TF_CONFIG: this task is the evaluator, which takes no part in data-parallel training, and kiln has no "
        "side-car evaluator; evaluate the versions the chief publishes with `kiln evaluate` instead");
  int rank = -1, seen = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (tasks[i].first != type) continue;
    if (seen++ == index) rank = static_cast<int>(i);
  }
  if (rank < 0)
    throw ValueError("TF_CONFIG: task type " + text_excerpt(type) + " index " + std::to_string(index) +
                     " is not in the cluster");
  ClusterSpec c;
  c.source = "TF_CONFIG";
  c.world_size = static_cast<int>(tasks.size());
  c.rank = rank;
  auto [master_host, master_port] = host_port(tasks[0].second, tasks[0].first + " address");
  c.master_addr = master_host;
  c.master_port = master_port;
  const std::string my_host = host_port(tasks[rank].second, type + " address").first;
  c.local_rank = 0;
  c.local_world_size = 0;
  for (size_t i = 0; i < tasks.size(); ++i) {
    if (host_port(tasks[i].second, tasks[i].first + " address").first != my_host) continue;
    if (static_cast<int>(i) < rank) ++c.local_rank;
    ++c.local_world_size;
  }
  return c;
}

PsClusterSpec ps_from_tf_config(const std::string& text) {
  const Json cfg = parse_tf_config(text);
  if (!cfg.is_object() || !cfg.contains("cluster") || !cfg["cluster"].is_object() || !cfg.contains("task") ||
      !cfg["task"].is_object())
    throw ValueError(
        "TF_CONFIG must be an object with \"cluster\" and \"task\", e.g. {\"cluster\": {\"chief\": "
        "[\"host0:2222\"], \"worker\": [\"host1:2222\"], \"ps\": [\"host2:2222\"]}, \"task\": {\"type\": "
        "\"ps\", \"index\": 0}}");
  PsClusterSpec c;
  std::map<std::string, std::vector<std::string>*> lists = {
      {"chief", &c.chief}, {"worker", &c.worker}, {"ps", &c.ps}, {"evaluator", &c.evaluator}};
  std::map<std::string, std::string> owner;  // "host:port" -> "ps[1]", to find two tasks on one address
  for (auto& [k, v] : cfg["cluster"].items()) {
    auto it = lists.find(k);
    if (it == lists.end())
      throw ValueError("TF_CONFIG: cluster role " + text_excerpt(k) +
                       " is not one of a parameter-server job's roles; use \"chief\", \"worker\", \"ps\" and "
                       "\"evaluator\"");
    if (!v.is_array()) throw ValueError("TF_CONFIG: cluster." + k + " must be a list of \"host:port\"");
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string where = k + "[" + std::to_string(i) + "]";
      if (!v[i].is_string()) throw ValueError("TF_CONFIG: cluster." + where + " must be a \"host:port\" string");
      const std::string addr = v[i].get<std::string>();
      host_port(addr, "cluster." + where);
      if (auto [o, fresh] = owner.emplace(addr, where); !fresh)
        throw ValueError("TF_CONFIG: cluster." + where + " and cluster." + o->second + " share the address " +
                         text_excerpt(addr) + "; give every task its own port");
      it->second->push_back(addr);
    }
  }
  if (c.ps.empty())
    throw ValueError(
        "TF_CONFIG: a parameter-server job needs at least one \"ps\" task in the cluster; without parameter "
        "servers, train data-parallel (resolve_cluster)");
  if (c.worker.empty()) throw ValueError("TF_CONFIG: a parameter-server job needs at least one \"worker\" task");
  if (c.chief.size() > 1)
    throw ValueError("TF_CONFIG: cluster.chief must list at most one task. Received: " +
                     std::to_string(c.chief.size()));
  const Json& task = cfg["task"];
  if (!task.contains("type") || !task["type"].is_string() || !task.contains("index") ||
      !task["index"].is_number_integer())
    throw ValueError("TF_CONFIG: task must be {\"type\": \"chief\"|\"worker\"|\"ps\"|\"evaluator\", \"index\": N}");
  c.task_type = task["type"].get<std::string>();
  const long index = task["index"].get<long>();
  auto it = lists.find(c.task_type);
  if (it == lists.end())
    throw ValueError("TF_CONFIG: task type " + text_excerpt(c.task_type) +
                     " is not \"chief\", \"worker\", \"ps\" or \"evaluator\"");
  if (index < 0 || index >= static_cast<long>(it->second->size()))
    throw ValueError("TF_CONFIG: task type " + text_excerpt(c.task_type) + " index " + std::to_string(index) +
                     " is not in the cluster (cluster." + c.task_type + " lists " + std::to_string(it->second->size()) +
                     " tasks)");
  c.task_index = static_cast<int>(index);
  return c;
}

ClusterSpec from_slurm(const GetEnv& env) {
  ClusterSpec c;
  c.source = "slurm";
  c.world_size = int_var("SLURM_NTASKS", env("SLURM_NTASKS").value_or("1"), 1, 1 << 20);
  c.rank = int_var("SLURM_PROCID", *env("SLURM_PROCID"), 0, c.world_size - 1);
  c.local_rank = int_var("SLURM_LOCALID", env("SLURM_LOCALID").value_or("0"), 0, c.world_size - 1);
  // SLURM_TASKS_PER_NODE reads like "2(x3)"; its leading count is this job's
  // per-node count when all nodes are alike.
  std::string per_node = env("SLURM_NTASKS_PER_NODE").value_or(env("SLURM_TASKS_PER_NODE").value_or(""));
  per_node = per_node.substr(0, per_node.find_first_not_of("0123456789"));
  c.local_world_size = per_node.empty() ? 1 : int_var("SLURM_NTASKS_PER_NODE", per_node, 1, c.world_size);
  auto nodes = env("SLURM_JOB_NODELIST");
  if (!nodes) nodes = env("SLURM_NODELIST");
  if (auto a = env("MASTER_ADDR"))
    c.master_addr = *a;
  else if (nodes)
    c.master_addr = first_slurm_host(*nodes);
  else if (c.world_size > 1)
    throw ValueError("SLURM_PROCID is set but SLURM_JOB_NODELIST is not; run under srun or set MASTER_ADDR");
  if (auto p = env("MASTER_PORT")) c.master_port = int_var("MASTER_PORT", *p, 1, 65535);
  return c;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at a comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  std::string first = nodelist.substr(0, end);
  const auto open = first.find('[');
  if (open == std::string::npos) {
    if (first.empty()) throw ValueError("SLURM_JOB_NODELIST is empty");
    return first;
  }
  // prefix[01-04,07]suffix -> prefix01suffix
  const auto close = first.find(']', open);
  if (close == std::string::npos) throw ValueError("SLURM_JOB_NODELIST: unbalanced '[' in " + text_excerpt(nodelist));
  std::string range = first.substr(open + 1, close - open - 1);
  range = range.substr(0, range.find_first_of(",-"));
  return first.substr(0, open) + range + first.substr(close + 1);
}

ClusterSpec resolve_cluster(const GetEnv& getenv) {
  const GetEnv env = getenv ? getenv : GetEnv(process_env);
  if (env("RANK")) return from_torchrun(env);
  if (auto tf = env("TF_CONFIG"); tf && !tf->empty()) return from_tf_config(*tf);
  if (env("SLURM_PROCID")) return from_slurm(env);
  return ClusterSpec();
}

const std::string& PsClusterSpec::address() const {
  const std::vector<std::string>* list = is_chief() ? &chief : is_worker() ? &worker : is_ps() ? &ps : &evaluator;
  if (task_index < 0 || task_index >= static_cast<int>(list->size()))
    throw ValueError("PsClusterSpec: task " + task_type + " " + std::to_string(task_index) + " is not in the cluster");
  return (*list)[task_index];
}

PsClusterSpec resolve_ps_cluster(const GetEnv& getenv) {
  const GetEnv env = getenv ? getenv : GetEnv(process_env);
  auto tf = env("TF_CONFIG");
  if (!tf || tf->empty())
    throw ValueError(
        "parameter-server training needs TF_CONFIG with \"chief\", \"worker\" and \"ps\" tasks, e.g. "
        "TF_CONFIG='{\"cluster\": {\"chief\": [\"host0:2222\"], \"worker\": [\"host1:2222\"], \"ps\": "
        "[\"host2:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}' (see docs/DISTRIBUTED.md)");
  return ps_from_tf_config(*tf);
}

bool is_ps_cluster(const GetEnv& getenv) {
  const GetEnv env = getenv ? getenv : GetEnv(process_env);
  auto tf = env("TF_CONFIG");
  if (!tf || tf->empty()) return false;
  try {
    const Json cfg = parse_tf_config(*tf);
    return cfg.is_object() && cfg.contains("cluster") && cfg["cluster"].is_object() && cfg["cluster"].contains("ps");
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace kiln::distribute
