"""gitdrop init: a hub with its hook and protective settings; re-running it
upgrades both in place and loses nothing."""

import os

from gitdrop import hub as hubmod, model

from conftest import Clone, refused_rule


def test_init_protects_the_hub(tmp_path):
    h = hubmod.init(str(tmp_path / "hub.git"))
    cfg = h.store.repo.config
    for key, want in {**hubmod.GIT_SETTINGS, **hubmod.GIT_DEFAULTS}.items():
        assert cfg[key] == want, key
    hook = os.path.join(h.path, "hooks", "pre-receive")
    with open(hook) as f:
        first = f.readline()
    assert first.startswith("#!/") and first.rstrip().endswith(" -SE")
    assert os.path.isabs(first[2:].split()[0])


def test_reinit_upgrades_hook_and_settings_and_loses_nothing(tmp_path):
    path = str(tmp_path / "hub.git")
    h = hubmod.init(path)
    room = h.room("lobby")
    room.register("core/juno", ["lead"])
    room.create_task("core/juno", "keep me")
    h.create_room("core/juno", "side")
    tips = {r: h.store.room_tip(r) for r in ("lobby", "side")}
    hub_tip = h.store.tip("refs/heads/hub")
    # an old or damaged install: the hook gone, a setting turned off
    os.remove(os.path.join(path, "hooks", "pre-receive"))
    h.store.repo.config["receive.denyNonFastForwards"] = "false"
    h.store.repo.config["receive.maxInputSize"] = "4g"   # the owner's choice is kept
    again = hubmod.init(path)
    assert os.access(os.path.join(path, "hooks", "pre-receive"), os.X_OK)
    assert again.store.repo.config["receive.denyNonFastForwards"] == "true"
    assert again.store.repo.config["receive.maxInputSize"] == "4g"
    assert {r: again.store.room_tip(r) for r in ("lobby", "side")} == tips
    assert again.store.tip("refs/heads/hub") == hub_tip
    assert [r["room"] for r in again.rooms()] == ["lobby", "side"]
    # and the restored hook is live
    c = Clone(path, tmp_path / "c", "lobby", "core/nobody")
    c.write(model.task_path(9), "+++\nid = \"9\"\ntitle = \"x\"\ncreator = \"core/nobody\"\n+++\n")
    c.commit("sneak")
    ok, err = c.push()
    assert not ok and refused_rule(err) == "registered-author"
