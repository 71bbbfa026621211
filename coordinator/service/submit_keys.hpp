#pragma once
// SubmitKeys: idempotent submission (the Idempotency-Key header). A submission with a key
// records the key with the jobs it made in the same change as those jobs, so the key is
// durable exactly when they are; a retry with the same key from the same user is answered
// with those jobs and makes none. While that change waits in the current commit batch the
// key is held here, and a retry waits for the same commit; once it is on disk the key is
// let go and a retry reads it from the store (one primary-key read). So memory holds one
// batch's keys, never all of them. Keys older than kKeep are pruned in bounded changes.
// Lives on the coordinator's event loop.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/core/error.hpp"
#include "common/core/time.hpp"
#include "common/net/http_types.hpp"
#include "coordinator/store/store.hpp"

namespace corral::service {

class SubmitKeys {
 public:
  using Respond = std::function<void(net::HttpResponse)>;
  static constexpr std::size_t kMaxKeyLength = 128;
  // A retry comes within seconds; a day covers a client that retries after a long outage.
  static constexpr Duration kKeep = std::chrono::hours(24);
  static constexpr Duration kPruneEvery = std::chrono::minutes(10);
  // Per prune: a bounded transaction, and still 700,000 keys a day.
  static constexpr int kPruneBatch = 5000;

  explicit SubmitKeys(store::Store& store) : store_(store) {}

  // The request's key; "" when it carries none. InvalidArgument naming Idempotency-Key
  // for an empty, long or repeated one, or one with other than visible ASCII characters.
  [[nodiscard]] static Result<std::string> key_of(const net::HttpRequest& request);

  // What a submission with this key made already: nullopt for a new key. A key whose
  // change is not committed yet parks `respond`, which `settle` answers, and gives an
  // empty list. Unavailable when the store cannot be read.
  [[nodiscard]] Result<std::optional<std::vector<model::JobId>>> find(const std::string& user,
                                                                      const std::string& key,
                                                                      Respond& respond);
  // A submission with this key made `ids` (consecutive, as an array's are) in `change`:
  // the key is written in it too, and held until `settle`.
  void record(const std::string& user, const std::string& key, const std::vector<model::JobId>& ids,
              TimePoint now, store::Change& change);
  // The change of this key was committed (or refused): the retries that waited for it,
  // to answer as the first; the key is let go.
  std::vector<Respond> settle(const std::string& user, const std::string& key);
  // A change that deletes keys older than kKeep, every kPruneEvery (and at the first
  // call, for what aged while the coordinator was down).
  std::optional<store::Change> prune_due(TimePoint now);

  std::size_t in_flight() const { return in_flight_.size(); }
  // Whether this key's change waits in the batch not yet committed.
  bool in_flight(const std::string& user, const std::string& key) const {
    return in_flight_.contains({user, key});
  }

 private:
  store::Store& store_;
  std::map<std::pair<std::string, std::string>, std::vector<Respond>> in_flight_;  // by (user, key)
  std::optional<TimePoint> last_prune_;
};

}  // namespace corral::service
