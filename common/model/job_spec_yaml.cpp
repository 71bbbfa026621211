#include "common/model/job_spec_yaml.hpp"
