// NodeListing: what it appends is what node_json renders, whatever changed in between.

#include <gtest/gtest.h>

#include <string>

#include "coordinator/service/views.hpp"

namespace corral::service {
namespace {

model::Node node(const std::string& name, int gpus) {
  model::Node n;
  n.name = name;
  n.address = "10.0.0.1";
  n.ports = {29500, 29599};
  for (int i = 0; i < gpus; ++i) {
    model::Gpu g;
    g.index = i;
    g.uuid = "GPU-" + name + "-" + std::to_string(i);
    g.cls = {"NVIDIA H100 80GB HBM3", 81559, "550.54.15"};
    n.gpus.push_back(g);
  }
  return n;
}

std::string listed(NodeListing& listing, const NodeView& v, NodeGpus gpus = NodeGpus::Each) {
  std::string out;
  listing.append(v, gpus, out);
  return out;
}

std::string rendered(const NodeView& v, NodeGpus gpus = NodeGpus::Each) {
  return node_json(v, gpus).dump(-1, ' ', false, Json::error_handler_t::replace);
}

TEST(NodeListing, AppendsWhatNodeJsonRendersAsTheNodeChanges) {
  NodeListing listing;
  model::Node n = node("gpu-a", 2);
  NodeView v;
  v.node = &n;
  v.connected = true;
  v.driver = "550.54.15";
  v.cuda = "12.4";
  v.holders = {std::nullopt, std::nullopt};
  v.last_seen = from_millis(1'700'000'000'000);
  EXPECT_EQ(listed(listing, v), rendered(v));
  // Each heartbeat moves last_seen alone.
  v.last_seen = from_millis(1'700'000'001'000);
  EXPECT_EQ(listed(listing, v), rendered(v));
  v.last_seen.reset();
  EXPECT_EQ(listed(listing, v), rendered(v));
  // A job takes a GPU; the node is drained, with a reason that needs escaping; it goes away.
  v.holders[1] = 42;
  EXPECT_EQ(listed(listing, v), rendered(v));
  EXPECT_NE(listed(listing, v).find("\"job\":42"), std::string::npos);
  n.state = model::NodeState::Drained;
  n.reason = "fan \"3\"\nreplaced";
  EXPECT_EQ(listed(listing, v), rendered(v));
  v.connected = false;
  EXPECT_EQ(listed(listing, v), rendered(v));
  // Its silence is shown, since when and until when, and goes when it is back.
  v.silent_since = from_millis(1'700'000'001'000);
  v.lost_at = from_millis(1'700'000'301'000);
  EXPECT_EQ(listed(listing, v), rendered(v));
  EXPECT_NE(listed(listing, v).find("\"lost_at\":\"2023-11-14T22:18:21.000Z\""), std::string::npos);
  v.silent_since.reset();
  v.lost_at.reset();
  EXPECT_EQ(listed(listing, v), rendered(v));
  n.gpus.pop_back();
  v.holders.pop_back();
  EXPECT_EQ(listed(listing, v), rendered(v));
}

TEST(NodeListing, ByClassCountsEachClassAndWhatJobsHoldAndFollowsTheNode) {
  NodeListing listing;
  model::Node n = node("gpu-a", 4);
  n.gpus[2].cls = {"NVIDIA L4", 23034, "550.54.15"};
  NodeView v;
  v.node = &n;
  v.holders = {std::nullopt, 7, std::nullopt, std::nullopt};
  // Both listings kept side by side, each what node_json renders.
  EXPECT_EQ(listed(listing, v), rendered(v));
  EXPECT_EQ(listed(listing, v, NodeGpus::Classes), rendered(v, NodeGpus::Classes));
  Json j = Json::parse(listed(listing, v, NodeGpus::Classes));
  EXPECT_FALSE(j.contains("gpus"));
  ASSERT_EQ(j["gpu_classes"].size(), 2u) << j.dump();
  EXPECT_EQ(j["gpu_classes"][0]["name"], "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(j["gpu_classes"][0]["count"], 3);
  EXPECT_EQ(j["gpu_classes"][0]["used"], 1);
  EXPECT_EQ(j["gpu_classes"][1]["name"], "NVIDIA L4");
  EXPECT_EQ(j["gpu_classes"][1]["memory_mib"], 23034);
  EXPECT_EQ(j["gpu_classes"][1]["count"], 1);
  EXPECT_EQ(j["gpu_classes"][1]["used"], 0);
  // A job takes the L4: the kept rendering by class is made again.
  v.holders[2] = 8;
  j = Json::parse(listed(listing, v, NodeGpus::Classes));
  EXPECT_EQ(j["gpu_classes"][1]["used"], 1);
  EXPECT_EQ(listed(listing, v), rendered(v));
  EXPECT_EQ(listing.kept(), 1u);
}

TEST(NodeListing, KeepsOnlyTheNodesStillListedAndRendersAReturningOneAfresh) {
  NodeListing listing;
  model::Node a = node("gpu-a", 1);
  model::Node b = node("gpu-b", 1);
  NodeView va;
  va.node = &a;
  va.holders = {std::nullopt};
  NodeView vb = va;
  vb.node = &b;
  listed(listing, va);
  listed(listing, vb);
  EXPECT_EQ(listing.kept(), 2u);
  listing.keep_only({"gpu-b"});  // gpu-a left the cluster
  EXPECT_EQ(listing.kept(), 1u);
  EXPECT_EQ(listed(listing, va), rendered(va));
  EXPECT_EQ(listing.kept(), 2u);
  listing.keep_only({});
  EXPECT_EQ(listing.kept(), 0u);
}

}  // namespace
}  // namespace corral::service
