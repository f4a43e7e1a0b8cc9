// The list pages' filter: a vhost (the list is then asked for per vhost, /api/queues/{vhost}) and
// a piece of the name. Changing either reloads the list.

import { get, path } from "./api.js";
import { h } from "./dom.js";

export function listFilter(ctx, kind) {
  const vhost = h("select", { id: `${kind}-vhost`, onchange: () => ctx.refresh() }, h("option", { value: "" }, "all vhosts"));
  const name = h("input", { id: `${kind}-filter`, placeholder: "name contains", oninput: () => ctx.refresh() });
  return {
    controls: h("p", { class: "filter" }, vhost, " ", name),
    // the list, and the vhosts for the select (kept in step with the node's)
    async load() {
      const chosen = vhost.value;
      const [vhosts, items] = await Promise.all([
        get("/api/vhosts"),
        get((chosen ? path(kind, chosen) : `/api/${kind}`) + "?sort=name"),
      ]);
      const names = vhosts.map((v) => v.name).sort();
      const shown = [...vhost.options].slice(1).map((o) => o.value);
      if (names.join("\0") !== shown.join("\0")) {
        vhost.replaceChildren(h("option", { value: "" }, "all vhosts"), ...names.map((n) => h("option", { value: n }, n)));
        vhost.value = names.includes(chosen) ? chosen : "";
      }
      const piece = name.value.toLowerCase();
      return piece ? items.filter((item) => item.name.toLowerCase().includes(piece)) : items;
    },
  };
}
