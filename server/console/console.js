// The console's entry: tabs, the key dialog, and the live reading that feeds all three views.
import { setUpKeyDialog } from "./api.js";
import { startLive } from "./live_view.js";
import { updateServed } from "./served_view.js";
import { setUpTry, updateModels } from "./try_view.js";

function showView(name) {
  for (const tab of document.querySelectorAll("nav [role=tab]")) {
    tab.setAttribute("aria-selected", String(tab.dataset.view === name));
  }
  for (const view of document.querySelectorAll(".view")) view.hidden = view.id !== `view-${name}`;
}

for (const tab of document.querySelectorAll("nav [role=tab]")) {
  tab.addEventListener("click", () => showView(tab.dataset.view));
}
setUpTry();
setUpKeyDialog(() => {});
startLive({
  served: (entries) => {
    updateModels(entries);
    updateServed(entries).catch(() => {});
  },
});
