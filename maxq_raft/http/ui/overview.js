// Overview: totals, the message-rate chart (sampled here at each refresh), nodes and listeners.

import { get } from "./api.js";
import { chart, legend, RateHistory } from "./chart.js";
import { h, num, section, table } from "./dom.js";

const history = new RateHistory(); // lives as long as the tab: switching pages keeps it

function cards(items) {
  return h("div", { class: "cards" }, items.map(([label, value, id]) => h("div", { class: "card", id }, h("b", {}, num(value)), label)));
}

export function overviewPage() {
  return {
    title: "Overview",
    async load() {
      const overview = await get("/api/overview");
      history.add(overview.message_stats);
      const q = overview.queue_totals || {};
      const o = overview.object_totals || {};
      let nodes = null;
      try {
        nodes = await get("/api/nodes");
      } catch (error) {
        if (error.loggedOut) throw error;
        // a management user without "monitoring" sees the rest of the overview
      }
      return h(
        "div",
        {},
        h("p", { class: "muted" }, `${overview.product_name} ${overview.product_version} · node ${overview.node} · cluster ${overview.cluster_name} · up ${num(overview.uptime_s)} s`),
        section("Messages", cards([["total", q.messages, "total-messages"], ["ready", q.messages_ready], ["unacked", q.messages_unacknowledged]])),
        section("Message rates", chart(history), legend(history)),
        section("Objects", cards([["connections", o.connections], ["channels", o.channels], ["exchanges", o.exchanges], ["queues", o.queues], ["consumers", o.consumers]])),
        nodes &&
          section(
            "Nodes",
            table(
              [
                ["name", (n) => n.name],
                ["running", (n) => (n.running ? "yes" : "no")],
                ["maintenance", (n) => (n.being_drained ? "being drained" : "")],
                ["memory used", (n) => num(n.mem_used), "num"],
                ["disk free", (n) => num(n.disk_free), "num"],
                ["file descriptors", (n) => (n.fd_used === undefined ? "" : `${n.fd_used} / ${n.fd_total}`)],
                ["alarms", (n) => [n.mem_alarm && "memory", n.disk_free_alarm && "disk"].filter(Boolean).join(", ")],
              ],
              nodes,
            ),
          ),
        section(
          "Listeners",
          table([["node", (l) => l.node], ["protocol", (l) => l.protocol], ["port", (l) => l.port, "num"]], overview.listeners || []),
        ),
      );
    },
  };
}
