#include "common/model/submission.hpp"

#include <gtest/gtest.h>

#include "common/model/job_spec_yaml.hpp"

namespace corral::model {
namespace {

TEST(ExportChoice, IsAllNoneOrAListOfNames) {
  EXPECT_EQ(parse_export_choice("ALL", "--export"), (ExportChoice{true, {}}));
  EXPECT_EQ(parse_export_choice("all", "--export"), (ExportChoice{true, {}}));  // as sbatch
  EXPECT_EQ(parse_export_choice("NONE", "--export"), (ExportChoice{false, {}}));
  EXPECT_EQ(parse_export_choice("HF_HOME,PYTHONPATH", "--export"), (ExportChoice{false, {"HF_HOME", "PYTHONPATH"}}));
  for (const char* bad : {"", "A,,B", "A,", "1X", "A=b", "A B"}) {
    auto r = parse_export_choice(bad, "--export");
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_TRUE(r.error().message().starts_with("--export: must be ALL, NONE or variable names")) << r.error().message();
  }
}

TEST(ExportedEnvironment, TakesTheShellsVariablesButNeverCorralsOwnOrTheToken) {
  const EnvList environ = {{"PATH", "/venv/bin:/usr/bin"}, {"VIRTUAL_ENV", "/venv"}, {"CORRAL_TOKEN", "secret"},
                           {"CORRAL_URL", "https://c:8443"}, {"RANK", "7"}, {"CUDA_VISIBLE_DEVICES", "3"},
                           {"PWD", "/x"}, {"SHLVL", "2"}, {"_", "/usr/bin/corral"}, {"BASH_FUNC_f%%", "() { :; }"},
                           {"HF_HOME", "/data/hf"}, {"PATH", "/second"}};
  auto all = exported_environment(ExportChoice{}, environ, "--export");
  ASSERT_TRUE(all.has_value()) << all.error().message();
  EXPECT_EQ(*all, (EnvList{{"HF_HOME", "/data/hf"}, {"PATH", "/venv/bin:/usr/bin"}, {"VIRTUAL_ENV", "/venv"}}));
  auto some = exported_environment(ExportChoice{false, {"HF_HOME", "CORRAL_TOKEN", "UNSET"}}, environ, "--export");
  ASSERT_TRUE(some.has_value());
  EXPECT_EQ(*some, (EnvList{{"HF_HOME", "/data/hf"}}));
  auto none = exported_environment(ExportChoice{false, {}}, environ, "--export");
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());
}

TEST(ExportedEnvironment, AnOversizedOneIsRefusedNamingTheWayOut) {
  EnvList big;
  for (int i = 0; i < 200; ++i) big.emplace_back("V" + std::to_string(i), std::string(1000, 'x'));
  auto r = exported_environment(ExportChoice{}, big, "--export");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().message(),
            "--export: the variables to export hold 200690 bytes; at most 131072: name the ones the job needs "
            "(--export=VAR,...) or --export=NONE");
  EnvList many;
  for (int i = 0; i < 1100; ++i) many.emplace_back("V" + std::to_string(i), "x");
  r = exported_environment(ExportChoice{}, many, "export");
  ASSERT_FALSE(r.has_value());
  EXPECT_TRUE(r.error().message().starts_with("export: 1100 variables to export; at most 1024")) << r.error().message();
}

TEST(Submission, TheCoordinatorChecksWhatAClientSent) {
  EXPECT_TRUE(check_submission({"/home/alice/run", {{"HF_HOME", "/data"}}}).has_value());
  EXPECT_TRUE(check_submission({}).has_value());
  auto relative = check_submission({"home/alice", {}});
  ASSERT_FALSE(relative.has_value());
  EXPECT_EQ(relative.error().message(), "submit_dir: must be an absolute path");
  auto reserved = check_submission({"/x", {{"HF_HOME", "/d"}, {"MASTER_PORT", "1"}}});
  ASSERT_FALSE(reserved.has_value());
  EXPECT_EQ(reserved.error().message(),
            "environment[1]: variable MASTER_PORT cannot travel with a job (corral sets it, or it is no variable name)");
  auto nul = check_submission({"/x", {{"A", std::string("a\0b", 3)}}});
  ASSERT_FALSE(nul.has_value());
  EXPECT_EQ(nul.error().message(), "environment[0]: must not hold a NUL character");
}

TEST(JobSpecExport, TheSpecMayChooseWhatTravels) {
  const std::string head = "name: x\ncommand: true\nresources: {gpus_per_node: 1}\n";
  auto all = parse_job_spec(head + "export: ALL\n", "job.yaml");
  ASSERT_TRUE(all.has_value()) << all.error().message();
  EXPECT_EQ(all->export_env, (ExportChoice{true, {}}));
  auto list = parse_job_spec(head + "export: [HF_HOME, PYTHONPATH]\n", "job.yaml");
  ASSERT_TRUE(list.has_value()) << list.error().message();
  EXPECT_EQ(list->export_env, (ExportChoice{false, {"HF_HOME", "PYTHONPATH"}}));
  auto unset = parse_job_spec(head, "job.yaml");
  ASSERT_TRUE(unset.has_value());
  EXPECT_FALSE(unset->export_env.has_value());
  auto bad = parse_job_spec(head + "export: [HF_HOME, RANK]\n", "job.yaml");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().message(), "job.yaml:4:19: export[1]: corral sets RANK itself; it cannot be exported");
  auto word = parse_job_spec(head + "export: some of it\n", "job.yaml");
  ASSERT_FALSE(word.has_value());
  EXPECT_EQ(word.error().message(),
            "job.yaml:4:9: export: must be ALL, NONE or a list of variable names, got \"some of it\"");
}

TEST(JobSpecLaunch, GpuVisibilityIsNodeOrRank) {
  const std::string head = "name: x\ncommand: true\nresources: {gpus_per_node: 1}\n";
  auto dflt = parse_job_spec(head, "job.yaml");
  ASSERT_TRUE(dflt.has_value());
  EXPECT_EQ(dflt->gpu_visibility, GpuVisibility::Node);
  auto rank = parse_job_spec(head + "launch: {gpu_visibility: rank}\n", "job.yaml");
  ASSERT_TRUE(rank.has_value()) << rank.error().message();
  EXPECT_EQ(rank->gpu_visibility, GpuVisibility::Rank);
  auto bad = parse_job_spec(head + "launch: {gpu_visibility: gpu}\n", "job.yaml");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().message(), "job.yaml:4:26: launch.gpu_visibility: must be node or rank, got \"gpu\"");
}

}  // namespace
}  // namespace corral::model
