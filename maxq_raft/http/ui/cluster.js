// The cluster as this node sees it (GET /api/cluster/status): members, and each Raft group with
// its leader, term, commit and applied index, and each member's lag (known on the group's leader
// only: elsewhere blank).

import { get } from "./api.js";
import { h, num, section, table } from "./dom.js";

function lags(group) {
  return h(
    "span",
    {},
    group.members.map((m) => h("span", { class: m.connected === false ? "error" : "" }, `${m.node} lag ${m.lag ?? "?"}  `)),
  );
}

export function clusterPage() {
  return {
    title: "Cluster",
    async load() {
      const status = await get("/api/cluster/status");
      return h(
        "div",
        {},
        h("p", { class: "muted" }, `as node ${status.node} sees it · ${status.clustered ? "clustered" : "a single node (no Raft replication)"}${status.membership_change_pending ? " · a membership change is pending" : ""}`),
        section(
          "Members",
          table(
            [
              ["node", (m) => m.node],
              ["state", (m) => h("span", { class: m.state === "up" ? "" : "error" }, m.state)],
              ["metadata role", (m) => m.role],
              ["groups led", (m) => num(m.leads ?? ""), "num"],
              ["groups", (m) => m.groups ?? ""],
            ],
            status.members,
          ),
        ),
        section(
          "Raft groups",
          table(
            [
              ["group", (g) => g.group],
              ["leader", (g) => g.leader || h("span", { class: "error" }, "none")],
              ["term", (g) => num(g.term), "num"],
              ["commit index", (g) => num(g.commit_index), "num"],
              ["applied index", (g) => num(g.applied_index), "num"],
              ["members and lag", lags],
            ],
            status.groups,
          ),
          h("p", { class: "muted" }, "A member's lag (entries behind the leader) is known to its group's leader only: ? for groups another node leads; open that node's UI to see them."),
        ),
      );
    },
  };
}
